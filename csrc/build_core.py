"""cffi build script for reaper's C core (API mode, out-of-line).

Referenced from setup.py's ``cffi_modules``; builds the extension ``reaper._core``.
"""
import re
from pathlib import Path

from cffi import FFI

HEADER = Path(__file__).resolve().with_name("reaper_core.h")


def cdef_of(header: str) -> str:
    """reaper_core.h as cffi's cdef takes it, so that the header is the one source of the
    declarations: comments and preprocessor lines go, every #define becomes `...` (its
    value is read from the compiled header), and an array size cffi cannot compute (a
    macro, an expression) becomes `[...]`, filled in by the compiler."""
    text = re.sub(r"/\*.*?\*/", "", header, flags=re.S)
    lines = []
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["#define"] and len(words) > 2:
            lines.append(f"#define {words[1]} ...")
        elif not line.lstrip().startswith("#"):
            lines.append(line)
    return re.sub(r"\[\s*[^\]\d\s][^\]]*\]|\[\s*\d+\s*[-+*/][^\]]*\]", "[...]", "\n".join(lines))


ffi = FFI()
ffi.cdef(cdef_of(HEADER.read_text()))
ffi.set_source(
    "reaper._core",
    '#include "reaper_core.h"',
    # Paths relative to the project root, where setuptools runs this script.
    sources=["csrc/reaper_core.c"],
    include_dirs=["csrc"],
    extra_compile_args=["-std=gnu99", "-Wall", "-Wextra", "-O2"],
)

if __name__ == "__main__":
    ffi.compile(verbose=True)
