"""reaper's subcommands, one module each: ``reaper stats`` (stats.py), ``reaper top``
(top/: the live view, with rich), ``reaper watch`` (watch.py) and ``reaper node``
(node.py). Each has ``main(argv, sfd)``; they read their flags with reaper's scanner
(args.py), so an error is worded as reaper's. This package's own code is run() only:
its modules import nothing from it (no import cycle).

Off the way to any child's exec: cli.py imports this package only for a subcommand.
"""
import os

from reaper.options import UsageError


def run(name: str, argv: list, sfd: "int | None") -> int:
    """Runs subcommand name: its exit status. A usage error is one line on stderr and 2."""
    try:
        if name == "stats":
            from reaper.commands import stats

            return stats.main(argv, sfd)
        if name == "top":
            from reaper.commands import top

            return top.main(argv, sfd)
        if name == "node":
            from reaper.commands import node

            return node.main(argv, sfd)
        from reaper.commands import watch

        return watch.main(argv, sfd)
    except UsageError as e:
        os.write(2, f"reaper {name}: {e} (see 'reaper {name} --help')\n".encode())
        return 2
    except KeyboardInterrupt:
        return 130


def _watch_config(argv: list):
    """reaper watch's Config: the name tests/test_bad_input.py, test_manifests.py and
    test_budget_memory.py call (commands.watch.config)."""
    from reaper.commands import watch

    return watch.config(argv)
