"""Drawing ``reaper top`` with rich (an optional extra: importing this module fails
without it, and reaper top says how to install it). Every text from the page or
/proc goes in as rich Text, never as markup: a process named "[red]x" is shown as is.
"""
import os
import select
import time

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from reaper.commands import figures
from reaper.commands.top import model
from reaper.metrics.client import known, on
from reaper.text import display


def _t(text, style: str = "") -> Text:
    return Text(display(str(text)), style=style, no_wrap=True, overflow="ellipsis")


def _size(n) -> str:
    return "-" if n is None else "?" if not known(n) else f"{n / 2**20:.0f}M"


def render(frame: model.Frame, width: int, height: int, sort: str):
    """The screen: at most height lines of at most width columns."""
    parts = []
    if frame.view is None:
        parts.append(_t(f"reaper top: {frame.error or 'no page yet'}", "bold red"))
        return Group(*parts)
    parts.append(_t(frame.head, "bold"))
    if frame.error:
        parts.append(_t(f"(last fetch failed: {frame.error})", "red"))
    if frame.main:
        parts.append(_t(f"main child  {frame.main}"))
    if not frame.node:
        parts.append(_t(f"processes   {frame.counts}"))
    if not frame.node:                      # reaper node's are among its rows
        z = f"zombies     {frame.zombies}"
        if frame.parents:
            z += ", by parent: " + ", ".join(f"{name}[{pid}] {figures.n(n)}" for name, pid, n in frame.parents)
        parts.append(_t(z))
    for i, (name, state, starts, up) in enumerate(frame.services):
        restarts = starts - 1 if known(starts) and starts >= 1 else None
        parts.append(_t(f"{'services' if i == 0 else '':<12}{name}: {state}, up {up}, "
                        f"restarts {figures.n(restarts)}"))
    if frame.node:                          # the node's view (reaper/node/view.py): every line left
        room, title = max(height - len(parts) - 1, 1), None
        for section, text in frame.node_rows[:room]:
            parts.append(_t(f"{section if section != title else '':<12}{text}"))
            title = section
        parts.append(_t("q quit", "dim"))
        return Group(*parts)
    if frame.leftovers:
        parts.append(_t(f"leftovers   {frame.leftovers}"))
    if frame.cores:
        parts += [_t(line) for line in _cores(frame.cores, width)]
    if frame.holders:
        parts += _holders(frame, max(height - len(parts) - 8, 2))      # room left for some strays
    room = height - len(parts) - 3          # the table's head, a blank line, the key line
    table = Table(box=None, padding=(0, 1), expand=False, show_edge=False, header_style="bold reverse")
    for col, kw in (("PID", {"justify": "right"}), ("NAME", {"max_width": 18}), ("WHY", {}),
                    ("ACTION", {}), ("CPU", {"justify": "right"}), ("MEM", {"justify": "right"}),
                    ("AGE", {"justify": "right"})):
        table.add_column(col, no_wrap=True, overflow="ellipsis", **kw)
    shown = frame.strays[:max(room, 0)]
    for d in shown:
        table.add_row(_t(d["pid"]), _t(d["name"]), _t(d.get("reason") or "?"), _t(d.get("action") or "-"),
                      _t("-" if d.get("cpu") is None else figures.fmt(d["cpu"], ".2f")), _t(_size(d.get("memory"))),
                      _t("-" if d.get("age") is None else figures.dur(d["age"])))
    title = f"strays {len(frame.strays)}" + (f" ({len(shown)} shown)" if len(shown) < len(frame.strays) else "")
    parts += [_t(f"{title}, sorted by {sort}" + ("" if frame.local else "; ages: run in reaper's PID namespace"),
                 "bold"), table]
    parts.append(_t("q quit  c cpu  m memory  p pid  a age", "dim"))
    return Group(*parts)


def _holders(frame: model.Frame, room: int) -> list:
    """Device holders and stopped leftovers, with their owner (model.py, holders.py)."""
    table = Table(box=None, padding=(0, 1), expand=False, show_edge=False, header_style="bold reverse")
    for col, kw in (("PID", {"justify": "right"}), ("NAME", {"max_width": 18}), ("STATE", {}),
                    ("DEVICES", {"max_width": 30}), ("OWNER", {})):
        table.add_column(col, no_wrap=True, overflow="ellipsis", **kw)
    shown = frame.holders[:max(room - 2, 1)]
    for d in shown:
        table.add_row(_t(d["pid"]), _t(d["name"]), _t(model.STATES.get(d["state"], d["state"])), _t(d["devices"]),
                      _t(d["owner"]))
    title = f"device holders and stopped leftovers {len(frame.holders)}"
    if len(shown) < len(frame.holders):
        title += f" ({len(shown)} shown)"
    scanned, every = frame.scanned
    if scanned < every:
        title += f"; descriptors read of {scanned} of {every} processes"
    return [_t(title, "bold"), table]


def _cores(cores: list, width: int, lines: int = 2) -> list:
    """The busiest cores, as many as lines of width hold: "cpu7 100% sat 9m12s" (busy,
    seconds saturated) or "cpu7 streak 42s max 3m" (reaper node)."""
    cells = []
    for cpu, busy, total, streak, longest in cores:
        cell = f"cpu{cpu}"
        if busy is not None:
            cell += f" {figures.fmt(busy, '.0%')}"
        if total is not None and on(total):
            cell += f" sat {figures.dur(total)}"
        if streak is not None:
            cell += f" streak {figures.dur(streak)}"
        if longest is not None:
            cell += f" max {figures.dur(longest)}"
        cells.append(cell)
    out, line, shown = [], "cores      ", 0
    for cell in cells:
        if len(line) + 2 + len(cell) > width - 12:        # room for "(+N more)"
            out.append(line)
            if len(out) == lines:
                break
            line = " " * 11
        line += "  " + cell
        shown += 1
    else:
        out.append(line)
    if shown < len(cells):
        out[-1] += f"  (+{len(cells) - shown} more)"
    return out


def plain(frame: model.Frame) -> str:
    """One frame as text (a pipe, a file): 80 columns unless COLUMNS says more."""
    from reaper import usage

    width = usage.terminal_width()
    console = Console(width=width, no_color=True, force_terminal=False, record=False,
                      file=open(os.devnull, "w"), legacy_windows=False)
    with console.capture() as cap:
        console.print(render(frame, width, 10 ** 6, "cpu"))
    return cap.get()


def run(source: model.Source, interval: float) -> int:
    """The live screen until q (or Ctrl-C: SIGINT, as in any command)."""
    import termios
    import tty

    console = Console()
    saved = termios.tcgetattr(0)
    tty.setcbreak(0)              # keys one by one, no echo; Ctrl-C still SIGINT
    try:
        with Live(console=console, screen=True, auto_refresh=False) as live:
            while True:
                frame = source.frame(time.time())
                w, h = console.size
                live.update(render(frame, w, h, source.sort), refresh=True)
                if _keys(source, time.monotonic() + interval):
                    return 0
    finally:
        termios.tcsetattr(0, termios.TCSADRAIN, saved)


def _keys(source: model.Source, until: float) -> bool:
    """Reads keys until the next refresh; True on q. A sort key refreshes at once."""
    while True:
        left = until - time.monotonic()
        if left <= 0:
            return False
        ready, _, _ = select.select([0], [], [], left)
        if not ready:
            return False
        key = os.read(0, 1).decode("latin-1").lower()
        if key in ("q", ""):           # q, or the terminal gone
            return True
        if key in model.SORTS:
            source.sort = model.SORTS[key]
            return False


