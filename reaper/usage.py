"""reaper's --help text, and writing it (or any client's output) to standard output.

Apart from reaper/options.py, whose table it reads: every byte of that module is
loaded on the way from start to the child's exec, this one only when asked.
"""
import os

from reaper.options import MAX_SECONDS, OPTIONS


def write_stdout(text: str, prog: str = "reaper", closed: bool = False) -> int:
    """Writes text to fd 1 (not sys.stdout: it is None when fd 1 was closed) and
    returns the exit status: 0, or 1 after one line on stderr when standard output
    cannot be written (closed, full, a broken pipe), as coreutils does. closed: the
    caller knows fd 1 was closed when it started (its number may have been reused)."""
    import errno

    data = text.encode("utf-8", "backslashreplace")
    try:
        if closed or _is_signalfd(1):     # fd 1 was closed: reaper's signalfd took its number
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        while data:
            data = data[os.write(1, data):]
    except OSError as e:
        try:
            os.write(2, f"{prog}: cannot write to standard output: {e.strerror}\n".encode())
        except OSError:
            pass
        return 1
    return 0


def _is_signalfd(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[signalfd]"
    except OSError:
        return False


_SECTIONS = (("core", "Options"), ("services", "Supervised services"),
             ("budget", "Budgets for stray processes (CPU, memory, lifetime)"),
             ("metrics", "Statistics"))


def help_text() -> str:
    lines = [
        "usage: reaper [OPTIONS] [--] COMMAND [ARGS...]",
        "       reaper -P [OPTIONS]                  (pause mode: no command)",
        "       reaper stats [--url URL | --file PATH]",
        "       reaper watch [OPTIONS]",
        "",
        "Runs COMMAND as the main child, reaps every orphan, forwards signals and exits",
        "with COMMAND's status. Every option also reads a REAPER_* environment variable.",
        f"SECONDS are at most {MAX_SECONDS} (one week). Quiet by default: errors, warnings and,",
        "when reaper did something (reaped an orphan, drained, acted on a budget), one",
        "summary line at exit.",
    ]
    rows = []
    for section, title in _SECTIONS:
        rows.append(("", title + ":"))
        for o in OPTIONS:
            if o.section != section:
                continue
            flag = (f"-{o.short}, " if o.short else "    ") + f"--{o.long}" + (f" {o.metavar}" if o.metavar else "")
            rows.append((flag, o.help + (f"  [{o.env[0]}]" if o.env else "")))
    rows += [("", ""), ("-h, --help", "show this help and exit"), ("-V, --version", "show the version and exit"),
             ("-l, --license", "show the license and exit")]
    width = max(len(f) for f, _ in rows) + 2
    for flag, text in rows:
        if not flag:
            lines += ["", text] if text else [""]
        else:
            lines.append(f"  {flag:<{width}}{text}")
    return "\n".join(lines) + "\n"
