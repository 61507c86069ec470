"""The one client of reaper's metrics endpoint: fetch a page (or read a metrics file),
parse it, and read it by metric name (View). reaper stats and reaper top use it; the
names it reads are reaper.metrics.names, the ones the sections write.

What it reads is hostile input (an endpoint or a file anyone may point it at): a
fetch, connect to last byte, ends within its timeout; at most MAX_BYTES are read; a
file must be a regular file. It prints nothing: Unreadable says in one line why a
page could not be had.

Public: Unreadable, MAX_BYTES, default_url(), endpoint(), fetch(), read_file(),
hung_fetches(), View, known(), on().
"""
import math
import os

from reaper.metrics import names as N

MAX_BYTES = 4 << 20     # 4 MiB: a reaper's page is some kB (docs/reaper-stats.md, Notes)
FETCH_THREAD = "fetch"  # the threads fetch() leaves behind when a server outlives the timeout


class Unreadable(Exception):
    """The page or file could not be read or is not reaper's: one line says why."""


def default_url(environ=None) -> str:
    """The endpoint reaper serves by default, where REAPER_METRICS_PORT and
    REAPER_METRICS_ADDRESS (as reaper read them) put it. Raises options.UsageError."""
    from reaper import options

    rows = tuple(o for o in options.OPTIONS if o.long in ("metrics-port", "metrics-address"))
    cfg = options.configure([], rows, os.environ if environ is None else environ)
    port = cfg.metrics_port or options.DEFAULT_METRICS_PORT
    host = cfg.metrics_address
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}/metrics"


def endpoint(url: str) -> str:
    """url as given, or HOST:PORT: a scheme and /metrics where none is given."""
    if "://" not in url:
        url = "http://" + url
    scheme, _, rest = url.partition("://")
    if "/" not in rest:
        url += "/metrics"
    return url


def fetch(url: str, timeout: float) -> list:
    """The samples of the page at url (a URL or HOST:PORT). Raises Unreadable."""
    from reaper.text import display

    try:
        return _samples(_fetch(endpoint(url), timeout))
    except OSError as e:
        raise Unreadable(display(str(e))) from None


def read_file(path: str) -> list:
    """The samples of a metrics file (--metrics-file). Raises Unreadable."""
    from reaper.text import display

    try:
        return _samples(_read_file(path))
    except OSError as e:
        raise Unreadable(display(str(e))) from None
    except UnicodeDecodeError:
        raise Unreadable(f"{display(path)} is not UTF-8 text") from None


def hung_fetches() -> int:
    """Fetch threads still running past their timeout (a server that drips)."""
    import threading

    return sum(1 for t in threading.enumerate() if t.name == FETCH_THREAD and t.is_alive())


# A number on a page may be NaN or ±Inf (the parser takes them): it is not known, and
# a flag or state that is not a known number is not set.

def known(v) -> bool:
    return v is not None and math.isfinite(v)


def on(v) -> bool:
    return known(v) and v != 0


class View:
    """The samples by name: a page of a hundred thousand samples is not scanned whole
    for each number a view shows."""

    def __init__(self, samples) -> None:
        self.named: dict = {}
        for s in samples:
            self.named.setdefault(s.name, []).append(s)

    def get(self, name: str, **labels):
        """Sum of the samples named name whose labels include labels; None if there is none."""
        found = [s.value for s in self.rows(name) if all(s.labels.get(k) == v for k, v in labels.items())]
        return sum(found) if found else None

    def by(self, name: str, label: str, **labels) -> dict:
        out: dict = {}
        for s in self.rows(name):
            if all(s.labels.get(k) == v for k, v in labels.items()):
                key = s.labels.get(label, "")
                out[key] = out.get(key, 0) + s.value
        return out

    def rows(self, name: str) -> list:
        return self.named.get(name, [])

    def split(self, label: str) -> dict:
        """A View per value of label, of the samples that have it."""
        parts: dict = {}
        for rows in self.named.values():
            for s in rows:
                if label in s.labels:
                    parts.setdefault(s.labels[label], []).append(s)
        return {key: View(rows) for key, rows in parts.items()}

    def current(self, name: str, label: str) -> "str | None":
        """The label of the one-hot gauge name that is 1 (a state, a phase); None if none is."""
        found = [k for k, n in self.by(name, label).items() if on(n)]
        return found[0] if found else None

    def info(self, label: str) -> str:
        """A label of reaper_build_info (version, mode); "?" when absent."""
        rows = self.rows(N.BUILD_INFO)
        return rows[0].labels.get(label, "?") if rows else "?"


def _samples(text: str) -> list:
    from reaper.text import display

    try:
        from prometheus_client.parser import text_string_to_metric_families

        samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    except Exception as e:
        raise Unreadable(f"not a Prometheus text exposition: {display(str(e))}") from None
    if not any(s.name == N.BUILD_INFO for s in samples):
        raise Unreadable(f"no reaper metrics there ({N.BUILD_INFO} missing)")
    return samples


def _read_file(path: str) -> str:
    """A regular file's text: a FIFO (whose open would wait for a writer), a device
    (/dev/zero reads without end) or more than MAX_BYTES is refused."""
    from reaper.procfs.files import Refused, read_regular

    try:
        data = read_regular(path, MAX_BYTES)
    except Refused:
        raise                       # in its own words: "PATH is not a regular file"...
    except OSError as e:
        raise OSError(f"cannot read {path}: {e.strerror}") from None
    return data.decode("utf-8")


def _fetch(url: str, timeout: float) -> str:
    """The body at url, fetched in a thread: a socket's timeout bounds each operation,
    not their sum (a server that drips a byte a second never trips it), and not the
    name lookup; the thread is given timeout seconds in all, then left behind."""
    import threading

    result: list = []
    worker = threading.Thread(target=_get, args=(url, timeout, result), name=FETCH_THREAD, daemon=True)
    worker.start()
    worker.join(timeout)
    if not result:
        raise _timed_out(url, timeout)
    if isinstance(result[0], Exception):
        raise result[0]
    return result[0]


def _timed_out(url: str, timeout: float) -> OSError:
    return OSError(f"cannot fetch {url}: timed out after {timeout:g}s")


def _get(url: str, timeout: float, result: list) -> None:
    """Appends the body at url (decoded) or the OSError that says why not."""
    try:
        result.append(_request(url, timeout))
    except Exception as e:          # said by the main thread, one line
        result.append(e if isinstance(e, OSError) else OSError(f"cannot fetch {url}: {e!r}"))


def _request(url: str, timeout: float) -> str:
    import http.client
    import urllib.error
    import urllib.request

    from reaper.text import quoted

    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return _read_bounded(r, url).decode("utf-8", errors="replace")
    except urllib.error.HTTPError as e:
        raise OSError(f"{url}: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, TimeoutError):      # one operation took timeout: the whole did too
            raise _timed_out(url, timeout) from None
        reason = getattr(e.reason, "strerror", None) or str(e.reason)
        raise OSError(f"cannot fetch {url}: {reason}") from None
    except TimeoutError:
        raise _timed_out(url, timeout) from None
    except _TooLarge as e:
        raise OSError(str(e)) from None
    except http.client.HTTPException as e:        # LineTooLong, BadStatusLine (its line), IncompleteRead
        raise OSError(f"cannot fetch {url}: bad HTTP answer ({type(e).__name__} {quoted(str(e))})") from None
    except (ValueError, OSError) as e:
        raise OSError(f"cannot fetch {url}: {e}") from None


class _TooLarge(Exception):
    """More than MAX_BYTES (not an OSError: _request's handlers would reword it)."""


def _read_bounded(r, url: str) -> bytes:
    chunks, size = [], 0
    while True:
        chunk = r.read(1 << 16)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_BYTES:
            raise _TooLarge(f"{url}: more than {MAX_BYTES} bytes")
        chunks.append(chunk)
