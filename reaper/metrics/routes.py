"""The HTTP server's app (reaper/httpserver.py): /metrics, /healthz and /; any other
path is a 404.

One collection answers every asker for SCRAPE_CACHE seconds, each format and
encoding made from it once: a scrape flood (any number of clients asking as fast as
they can) costs PID 1 at most one collection a second, and a Prometheus at its interval still gets figures at most
SCRAPE_CACHE old. What the flood costs beyond that (accepting, reading, writing) is
bounded by the server (httpserver.ANSWER_SHARE).
"""
from __future__ import annotations

import gzip
import time

from prometheus_client.exposition import choose_encoder, gzip_accepted

from reaper.httpserver import Response, text

SCRAPE_CACHE = 1.0          # seconds one collection answers every scrape (docs/metrics.md)


class _Collected:
    """One collection's families, as an encoder asks for them (collect())."""

    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self) -> list:
        return self.families


def app(registry, log):
    # The server's one thread reads and writes these: one collection (when, families),
    # and its answers by (content type, gzip).
    last: list = [None, None]
    answers: dict = {}

    def metrics(request) -> Response:
        # The scraper's Accept picks the format (Prometheus asks for OpenMetrics).
        encoder, content_type = choose_encoder(request.headers.get("Accept") or "")
        zipped = gzip_accepted(request.headers.get("Accept-Encoding") or "")
        now = time.monotonic()
        try:
            if last[0] is None or now - last[0] >= SCRAPE_CACHE:
                last[:] = [now, _Collected(list(registry.collect()))]
                answers.clear()
            body = answers.get((content_type, zipped))
            if body is None:
                body = encoder(last[1])
                body = answers[(content_type, zipped)] = gzip.compress(body) if zipped else body
        except Exception as e:   # never a traceback on PID 1's stderr per scrape
            last[0] = None
            log.debug(f"metrics: scrape failed: {e!r}")
            return text(500, "collection failed\n")
        headers = [("Content-Type", content_type)]
        if zipped:
            headers.append(("Content-Encoding", "gzip"))
        return Response(200, headers, body)

    def route(request) -> Response:
        if request.path == "/metrics":
            return metrics(request)
        if request.path == "/healthz":
            return text(200, "ok\n")
        if request.path == "/":
            return text(200, "reaper: metrics at /metrics, health at /healthz\n")
        return text(404, "not found\n")
    return route
