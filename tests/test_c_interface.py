"""The C interface has one source and one user: csrc/reaper_core.h declares it (the cffi
build script derives its cdef from the header), and only reaper/_native.py touches the
C library and its structures."""
from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "csrc" / "reaper_core.h"


def _build_script():
    spec = importlib.util.spec_from_file_location("build_core", ROOT / "csrc" / "build_core.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_cdef_is_the_header():
    header = HEADER.read_text()
    cdef = _build_script().cdef_of(header)
    declared = set(re.findall(r"^\w[\w\s\*]*?\b(reaper_\w+)\s*\(", header, re.M))
    assert declared >= {"reaper_wait", "reaper_spawn", "reaper_exit_code"}, declared
    for name in declared:                               # every function, in the cdef as in the header
        assert re.search(rf"\b{name}\s*\(", cdef), name
    for struct in re.findall(r"^struct (reaper_\w+) \{", header, re.M):
        assert f"struct {struct} {{" in cdef, struct
    for macro in re.findall(r"^#define (REAPER_\w+) ", header, re.M):
        if macro != "REAPER_CORE_H":
            assert f"#define {macro} ..." in cdef, macro
    assert "/*" not in cdef and "#include" not in cdef and "#ifndef" not in cdef


def test_the_built_library_has_what_the_header_declares():
    from reaper._core import lib

    for name in re.findall(r"^\w[\w\s\*]*?\b(reaper_\w+)\s*\(", HEADER.read_text(), re.M):
        assert hasattr(lib, name), name
    assert lib.reaper_exit_code(9) == 137 and lib.reaper_exit_code(3 << 8) == 3
    assert lib.reaper_exec_failure_code(2) == 127 and lib.reaper_exec_failure_code(7) == 126   # ENOENT, E2BIG


def test_only_native_touches_the_c_library():
    users = []
    for path in sorted((ROOT / "reaper").rglob("*.py")):
        if path.name == "_native.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "reaper._core" or \
                    isinstance(node, ast.ImportFrom) and node.module == "reaper._native" and \
                    any(a.name in ("ffi", "lib") for a in node.names) or \
                    isinstance(node, ast.Attribute) and node.attr in ("_w", "_cfg", "spec"):
                users.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not users, f"C structures touched outside reaper/_native.py: {users}"
