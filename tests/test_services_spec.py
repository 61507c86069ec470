"""reaper/services/spec.py in process: service names, NAME=COMMAND, a --services-dir with
service directories and their setting files, and the checks resolve() makes before
anything starts (the black-box refusals are in test_services.py and test_bad_input.py)."""
from __future__ import annotations

import os

import pytest

from reaper import options
from reaper.services import spec

PARSERS = {o.dest: o.parse for o in options.OPTIONS}


def _executable(path, text="#!/bin/sh\nexit 0\n"):
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_names_and_commands():
    assert spec.check_name("log-shipper_2.x") == "log-shipper_2.x"
    for bad in ("", ".", "..", "a b", "a/b", "é"):
        with pytest.raises(ValueError, match="bad service name"):
            spec.check_name(bad)
    assert spec.parse_service("web=python -m http.server 'a b'") == ("web", ["python", "-m", "http.server", "a b"])
    for bad, why in (("web", "expected NAME=COMMAND"), ("web=", "empty command"), ("web='open", "cannot split")):
        with pytest.raises(ValueError, match=why):
            spec.parse_service(bad)


def test_a_services_dir_holds_programs_and_service_directories(tmp_path):
    _executable(tmp_path / "b-plain")
    (tmp_path / "a-dir").mkdir()
    _executable(tmp_path / "a-dir" / "run")
    (tmp_path / "a-dir" / "restart").write_text("on-failure\n")
    (tmp_path / "a-dir" / "restart-delay").write_text(" 2.5 ")
    (tmp_path / "a-dir" / "ready").write_text("")
    (tmp_path / "notes.txt").write_text("not executable")
    _executable(tmp_path / ".hidden")
    (tmp_path / "no-run").mkdir()
    found = spec.scan_dir(str(tmp_path), PARSERS)
    assert [name for name, _, _ in found] == ["a-dir", "b-plain"]
    assert found[0][1] == [str(tmp_path / "a-dir" / "run")]
    assert found[0][2] == {"restart": "on-failure", "restart_delay": 2.5, "ready": True}
    assert found[1][2] == {}


def test_a_bad_setting_file_is_refused_with_its_path(tmp_path):
    (tmp_path / "s").mkdir()
    _executable(tmp_path / "s" / "run")
    (tmp_path / "s" / "restart-delay").write_text("soon")
    with pytest.raises(ValueError, match=r"--services-dir: .*s/restart-delay"):
        spec.scan_dir(str(tmp_path), PARSERS)
    (tmp_path / "s" / "restart-delay").unlink()
    os.mkfifo(tmp_path / "s" / "restart")                  # never opened for long, never read
    with pytest.raises(ValueError, match="not a regular file"):
        spec.scan_dir(str(tmp_path), PARSERS)


def test_an_empty_or_missing_services_dir_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no executable file"):
        spec.scan_dir(str(tmp_path), PARSERS)
    with pytest.raises(ValueError, match="cannot read"):
        spec.scan_dir(str(tmp_path / "missing"), PARSERS)


def test_resolve_orders_checks_and_applies_the_settings(tmp_path):
    (tmp_path / "dir-svc").mkdir()
    _executable(tmp_path / "dir-svc" / "run")
    (tmp_path / "dir-svc" / "restart-max-delay").write_text("60")
    cfg = options.Config()
    cfg.services = [("first", ["true"])]
    cfg.services_dir = str(tmp_path)
    cfg.service_ready = ["first"]
    specs = spec.resolve(cfg, PARSERS)
    assert [(s.name, s.origin, s.ready) for s in specs] == [("first", "--service", True),
                                                            ("dir-svc", "--services-dir", False)]
    assert specs[1].setting(cfg, "restart_max_delay") == 60 and specs[0].setting(cfg, "restart_max_delay") == \
        cfg.restart_max_delay


@pytest.mark.parametrize("change,why", [
    (lambda c: setattr(c, "services", [("a", ["true"]), ("a", ["true"])]), "given twice"),
    (lambda c: setattr(c, "services", [("a", ["/nonexistent/program"])]), "cannot run"),
    (lambda c: setattr(c, "service_ready", ["nobody"]), "no service named"),
    (lambda c: setattr(c, "restart_max_delay", c.restart_delay / 2), "shorter than restart-delay"),
    (lambda c: setattr(c, "services", [(f"s{i}", ["true"]) for i in range(spec.MAX_SERVICES + 1)]), "at most"),
])
def test_resolve_refuses_what_could_not_run(change, why):
    cfg = options.Config()
    cfg.services = [("a", ["true"])]
    change(cfg)
    with pytest.raises(ValueError, match=why):
        spec.resolve(cfg, PARSERS)
