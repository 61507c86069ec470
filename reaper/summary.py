"""The exit summary: one JSON line on stderr (always with -v; by default only when
reaper did something, Stats.news) and in --summary-file. Loaded at the end, by
the boundary (reaper/boundary.py), only when someone reads it."""
import os


def write(cfg, stats, waiter, log) -> None:
    if stats is None:           # the boundary failed before the statistics existed: a summary still
        from reaper.stats import Stats

        stats = Stats()
        stats.native = None if waiter is None else waiter.totals
    if not cfg.summary_file and not log.enabled(2) and not (log.enabled(1) and stats.news(log.dropped)):
        return                  # nobody reads it: nothing is built on the way out
    import json

    summary = stats.summary()
    summary["log_lines_dropped"] = log.dropped
    line = json.dumps(summary, sort_keys=True)
    log.summary(f"summary {line}", stats.news(log.dropped))
    if cfg.summary_file:
        tmp = f"{cfg.summary_file}.tmp{os.getpid()}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, (line + "\n").encode())
            finally:
                os.close(fd)
            os.replace(tmp, cfg.summary_file)
        except OSError as e:
            log.error(f"cannot write summary file {cfg.summary_file}: {e.strerror}")
