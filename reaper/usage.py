"""reaper's --help text (and the rows of a subcommand's), and writing it (or any
client's output) to standard output.

Apart from reaper/options.py, whose table it formats (given by the caller: this
module imports no other of reaper's): every byte of that module is loaded on the
way from start to the child's exec, this one only when asked.
"""
import os


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


SECTIONS = (("core", "Options"), ("services", "Supervised services"),
            ("budget", "Budgets for stray processes (CPU, memory, lifetime)"),
            ("metrics", "Statistics"))
HELP_ROW = ("-h, --help", "show this help and exit")


def help_text(table: tuple, config: type, max_seconds: int) -> str:
    """reaper's --help: table, reaper/options.py's OPTIONS; config, its Config."""
    head = [
        "usage: reaper [OPTIONS] [--] COMMAND [ARGS...]",
        "       reaper -P [OPTIONS]                  (pause mode: no command)",
        "       reaper stats [--url URL | --file PATH]",
        "       reaper watch [OPTIONS]",
        "",
        "Runs COMMAND as the main child, reaps every orphan, forwards signals and exits",
        "with COMMAND's status. Every option also reads a REAPER_* environment variable.",
        f"SECONDS are at most {max_seconds} (one week). Quiet by default: errors, warnings and,",
        "when reaper did something (reaped an orphan, drained, acted on a budget), one",
        "summary line at exit.",
    ]
    rows = option_rows(table, config) + [("", ""), HELP_ROW, ("-V, --version", "show the version and exit"),
                                         ("-l, --license", "show the license and exit")]
    return render(head, rows)


def option_rows(table: tuple, config: type, helps: "dict | None" = None) -> list:
    """(flag, text) rows of table's options by section, each section under its title:
    the help text (helps[long] instead, where given) with "{default}" replaced by
    config's default, then the first variable."""
    rows = []
    for section, title in SECTIONS:
        picked = [o for o in table if o.section == section]
        if picked:
            rows.append(("", title + ":"))
        for o in picked:
            flag = (f"-{o.short}, " if o.short else "    ") + f"--{o.long}" + (f" {o.metavar}" if o.metavar else "")
            text = (helps or {}).get(o.long, o.help)
            if "{default}" in text:
                text = text.replace("{default}", shown(getattr(config, o.dest)))
            rows.append((flag, text + (f"  [{o.env[0]}]" if o.env else "")))
    return rows


def shown(value) -> str:
    """A default as --help shows it: 1.0 as 1, (5, 120.0) as 5/120."""
    if isinstance(value, tuple):
        return "/".join(shown(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def render(head: list, rows: list) -> str:
    """head's lines, then the rows: (flag, text) in two columns; ("", title) a
    title after an empty line; ("", "") an empty line."""
    lines = list(head)
    width = max(len(f) for f, _ in rows) + 2
    for flag, text in rows:
        if not flag:
            lines += ["", text] if text else [""]
        else:
            lines.append(f"  {flag:<{width}}{text}")
    return "\n".join(lines) + "\n"
