"""The exit summary: one JSON line on stderr (always with -v; by default only when
reaper did something, Stats.news) and in --summary-file. Loaded at the end, by
the boundary (reaper/boundary.py), only when someone reads it."""
import os


def write(cfg, stats, log) -> None:
    """Called by the boundary only when the summary is read (boundary._summarise)."""
    import json

    summary = stats.summary()
    summary["log_lines_dropped"] = log.dropped
    line = json.dumps(summary, sort_keys=True)
    log.summary(f"summary {line}", stats.news(log.dropped), summary)
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
