"""The subcommands' arguments: their own rows (reaper.options.Option) read by reaper's
scanner, so that an error is worded as reaper's; --help and -V answered alike."""
from reaper import options
from reaper.text import quoted

REQUESTS = {"--help": options.HelpRequested, "-h": options.HelpRequested,
            "--version": options.VersionRequested, "-V": options.VersionRequested}


def answered(parse, help_text, prog: str, closed: bool = False):
    """parse() for a subcommand: its result, or the exit status once --help or -V was
    answered on stdout (one wording for every subcommand)."""
    try:
        return parse()
    except options.HelpRequested:
        return options.write_stdout(help_text(), prog, closed)
    except options.VersionRequested:
        from reaper import __version__

        return options.write_stdout(f"reaper {__version__}\n", prog, closed)


def parse_client(argv: list, prog: str, flags: tuple, defaults: type, help_text, closed: bool):
    """A client's arguments (reaper stats, reaper top): its Args (defaults, with what
    the flags set), or the exit status once --help or -V was answered. Raises
    options.UsageError."""
    scanned = answered(lambda: options.scan(argv, flags, REQUESTS), help_text, prog, closed)
    if isinstance(scanned, int):
        return scanned
    found, rest = scanned
    if rest:
        raise options.UsageError(f"unexpected argument {quoted(rest[0])}")
    args = defaults()
    for opt, flag, value in found:
        try:
            setattr(args, opt.dest, opt.parse(value))
        except ValueError as e:
            raise options.UsageError(f"{flag}: {e}") from None
    return args


def stdout_closed() -> bool:
    """fd 1 closed: its number may be reused (by a fetch's socket), so nothing is
    written to it."""
    import os

    try:
        os.fstat(1)
        return False
    except OSError:
        return True


# The endpoint's flag and variables, as reaper stats and reaper top take them.
URL = options.Option("url", "", "url", "value", "the metrics endpoint: a URL, or HOST:PORT (default: "
                     "http://127.0.0.1:PORT/metrics, PORT from REAPER_METRICS_PORT, else 9259)", "URL")
ENVIRONMENT = (("REAPER_METRICS_PORT", "the port reaper serves its metrics on (without --url)"),
               ("REAPER_METRICS_ADDRESS", "the address it binds (0.0.0.0 and :: are asked on loopback)"))
