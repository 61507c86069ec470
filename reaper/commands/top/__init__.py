"""``reaper top``: a live, full-screen view of one reaper (init, watch or node mode)
from its metrics endpoint (docs/reaper-top.md). A plain client like ``reaper stats``,
through reaper.metrics.client (the whole-request timeout, the size cap); what it shows is made in model.py and drawn in screen.py with rich, an
optional extra (pip install 'reaper-init[top]') that PID 1 never imports.

Keys: q quits; c, m, p, a sort the strays by CPU, memory, pid, age. Over a pipe or
without a terminal it prints one frame and exits.
"""
import os
import time

from reaper import options
from reaper.commands import args as client_args
from reaper.options import Option

PROG = "reaper top"
INSTALL = "pip install 'reaper-init[top]'"


class Args:
    url = None
    timeout = 2.0
    interval = 1.0


FLAGS = (
    client_args.URL,
    Option("interval", "", "interval", "value", "seconds between refreshes ({default}; at least 0.1)",
           "SECONDS", lambda t: options.seconds(t, minimum=options.MIN_INTERVAL)),
    Option("timeout", "", "timeout", "value", "seconds to wait for each fetch ({default})", "SECONDS",
           options.seconds),
)
ENVIRONMENT = client_args.ENVIRONMENT + (
    ("REAPER_STRAY_MATCH", "with REAPER_PROTECT and REAPER_NO_RAY_AWARE: as reaper reads them, to tell "
                           "why a process is a stray (in reaper's PID namespace)"),
    ("REAPER_DEVICES", "as reaper reads it: the device files whose holders are shown (in reaper's PID namespace)"),
    ("COLUMNS, LINES", "the screen's size, where the terminal does not say"),
)


def help_text() -> str:
    from reaper import usage

    head = ["usage: reaper top [--url URL] [--interval SECONDS] [--timeout SECONDS]",
            "",
            "A running reaper, live and full screen: the main child, the phase, zombies by "
            "parent, the strays with why they are strays and what reaper does to each, the "
            "services, per-core CPU. Keys: q quits; c, m, p, a sort the strays by CPU, "
            "memory, pid, age. Over a pipe: one frame. Needs rich: " + INSTALL + "."]
    return usage.render(head, usage.option_rows(FLAGS, Args) + [("", ""), usage.HELP_ROW, usage.VERSION_ROW]
                        + usage.tail(ENVIRONMENT, "docs/reaper-top.md"))


def main(argv: list, sfd: "int | None" = None) -> int:
    closed = client_args.stdout_closed()
    args = client_args.parse_client(argv, PROG, FLAGS, Args, help_text, closed)
    if isinstance(args, int):
        return args
    from reaper.metrics import client

    url = args.url or client.default_url()
    try:
        from reaper.commands.top import screen
    except ImportError:          # rich is an optional extra
        os.write(2, f"{PROG}: needs the rich library: {INSTALL}\n".encode())
        return 1
    from reaper.commands.top import model

    source = model.Source(url, args.timeout)
    if closed or not (os.isatty(0) and os.isatty(1)):
        return _once(source, screen, closed)
    return screen.run(source, args.interval)


def _once(source, screen, closed: bool = False) -> int:
    """One frame to standard output (a pipe, a file, no terminal): 1 when the
    endpoint could not be read."""
    frame = source.frame(time.time())
    if frame.view is None:
        os.write(2, f"{PROG}: {frame.error}\n".encode())
        return 1
    return options.write_stdout(screen.plain(frame), PROG, closed)
