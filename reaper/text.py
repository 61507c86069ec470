"""Text helpers for reaper's messages and value parsers: ASCII digits, and text shown
on one line (undecodable bytes as \\xff, control characters escaped).

Imports nothing, so that any module may use it, on the way from start to the
child's exec too (reaper/options.py, reaper/signals.py), without a cycle.
"""


def digits(text: str) -> bool:
    """True for ASCII digits only: str.isdigit() and int() also take '٣' or '³'."""
    return text.isascii() and text.isdigit()


def display(text) -> str:
    """text for a one-line message, as is, except that bytes that were not UTF-8
    (surrogate escapes in argv and the environment, or a bytes object) show as \\xff,
    not \\udcff, and control characters (newlines...) are escaped: always one line
    that encodes as UTF-8."""
    return _show(text, False)


def quoted(text) -> str:
    """display(text) quoted like repr(): 'abc', '\\xff', '1\\n2'; a value of more than
    SHOWN_MAX characters shows its start and its length (5,000 digits in a variable:
    one readable line, not a screenful)."""
    text = _decoded(text)
    if len(text) > SHOWN_MAX:
        return _show(text[:SHOWN_MAX], True) + f"... ({len(text)} characters)"
    return _show(text, True)


SHOWN_MAX = 200     # characters of a quoted value a message shows: the rest is counted, not printed


def _decoded(text) -> str:
    if isinstance(text, (bytes, bytearray)):
        return bytes(text).decode("utf-8", "surrogateescape")
    return str(text)


def _show(text, quote: bool) -> str:
    text = _decoded(text)
    if text.isprintable():
        return repr(text) if quote else text
    out = []
    for c in text:
        o = ord(c)
        if 0xDC80 <= o <= 0xDCFF:               # an undecodable byte
            out.append(f"\\x{o - 0xDC00:02x}")
        elif quote and c in "\\'":
            out.append("\\" + c)
        elif c.isprintable():
            out.append(c)
        else:
            out.append(repr(c)[1:-1])           # \n, \x1b, \u2028, \ud800 ...
    return "'" + "".join(out) + "'" if quote else "".join(out)
