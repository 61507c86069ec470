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
            ("leftovers", "Leftovers of Ray workers and services (what they started, GPU holders first)"),
            ("metrics", "Statistics"))
HELP_ROW = ("-h, --help", "show this help and exit")


def help_text(table: tuple, config: type, max_seconds: int) -> str:
    """reaper's --help: table, reaper/options.py's OPTIONS; config, its Config."""
    head = [
        "usage: reaper [OPTIONS] [--] COMMAND [ARGS...]",
        "       reaper -P [OPTIONS]          (pause mode: no command)",
        "       reaper stats [--url URL | --file PATH]   (a running reaper's numbers)",
        "       reaper top [--url URL]       (the same, live, full screen)",
        "       reaper watch [OPTIONS]       (the sidecar of a shared PID namespace)",
        "       reaper node [OPTIONS]        (the node detector)",
        "",
        "Runs COMMAND as the main child, reaps every orphan, forwards signals and exits "
        "with COMMAND's status. Every option also reads the REAPER_* environment "
        "variable shown beside it (a flag wins over it). "
        f"SECONDS are at most {max_seconds} (one week). Quiet by default: errors, warnings "
        "and, when reaper did something (reaped an orphan, drained, acted on a budget), "
        "one summary line at exit. Each subcommand has its --help.",
    ]
    rows = option_rows(table, config) + [("", ""), HELP_ROW, VERSION_ROW,
                                         ("-l, --license", "show the license and exit")]
    return render(head, rows + tail((), "docs/reaper.md"))


VERSION_ROW = ("-V, --version", "show the version and exit")


def tail(environment: tuple, docs: str) -> list:
    """The rows that end a help: the variables not shown beside a flag (name, text),
    then where the documentation is."""
    rows = [("", "Environment:")] + [(name, text) for name, text in environment] if environment else []
    return rows + [("", f"Documentation: {docs} in reaper's source (the reaper-init project).")]


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


DEFAULT_WIDTH = 80
MIN_WIDTH = 40
FLAG_COLUMN = 30        # the text's column at most: a longer flag has its text on the next line


def terminal_width() -> int:
    """The width help is wrapped to: $COLUMNS, else standard output's terminal, else 80
    (a pipe, a file); never below MIN_WIDTH."""
    cols = os.environ.get("COLUMNS", "").strip()
    if cols.isascii() and cols.isdigit() and len(cols) < 5:
        return max(MIN_WIDTH, int(cols))
    try:
        return max(MIN_WIDTH, os.get_terminal_size(1).columns)
    except (OSError, ValueError):
        return DEFAULT_WIDTH


def render(head: list, rows: list, width: "int | None" = None) -> str:
    """head's lines (a paragraph each), then the rows: (flag, text) in two columns;
    ("", title) a title after an empty line; ("", "") an empty line. Every line is
    wrapped to width (the terminal's by default)."""
    import textwrap

    width = terminal_width() if width is None else width
    lines = []
    for line in head:
        indent = " " * (len(line) - len(line.lstrip(" ")))
        lines += textwrap.wrap(line, width, subsequent_indent=indent and indent + "  ",
                               break_on_hyphens=False) or [""]
    column = 2 + min(max(len(f) for f, _ in rows if f) + 2, FLAG_COLUMN, width // 3)
    for flag, text in rows:
        if not flag:
            lines += [""] + textwrap.wrap(text, width, break_on_hyphens=False) if text else [""]
            continue
        first = f"  {flag:<{column - 2}}"
        if len(flag) + 4 > column:          # no room for two spaces: the text starts on the next line
            lines.append(first.rstrip())
            first = " " * column
        lines += textwrap.wrap(text, width, initial_indent=first, subsequent_indent=" " * column,
                               break_on_hyphens=False, break_long_words=False)
    return "\n".join(lines) + "\n"
