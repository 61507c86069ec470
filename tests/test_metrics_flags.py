"""Bad metrics flags: one clear line, exit 2, and the child never starts."""
import os
import socket

import pytest

from conftest import free_port, run_reaper


def _run(tmp_path, flags, env=None):
    marker = tmp_path / "child-ran"
    r = run_reaper([*flags, "--", "sh", "-c", f"touch {marker}"], env=env)
    return r, marker


def _assert_refused(r, marker, *words):
    assert r.proc.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("reaper: ") and "Traceback" not in r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    assert not marker.exists(), "the child ran although the flags were bad"


def test_port_in_use(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        # reaper runs in a fresh PID namespace but the same network namespace.
        r, marker = _run(tmp_path, ["--metrics-port", str(port), "--metrics-address", "127.0.0.1"])
    _assert_refused(r, marker, "in use", str(port))


@pytest.mark.parametrize("address,words", [
    ("256.1.1.1", ["bad address", "256.1.1.1"]),
    ("not an address!", ["bad address"]),
    ("10.255.255.254", ["not an address of this host"]),
])
def test_bad_address(tmp_path, address, words):
    r, marker = _run(tmp_path, ["--metrics-port", str(free_port()), "--metrics-address", address])
    _assert_refused(r, marker, *words)


def test_bad_address_from_environment(tmp_path):
    r, marker = _run(tmp_path, [], env={"REAPER_METRICS_PORT": str(free_port()),
                                        "REAPER_METRICS_ADDRESS": "999.0.0.1"})
    _assert_refused(r, marker, "999.0.0.1")


@pytest.mark.parametrize("where", ["missing-dir/m.prom", "a-directory"])
def test_unwritable_metrics_file(tmp_path, where):
    (tmp_path / "a-directory").mkdir()
    r, marker = _run(tmp_path, ["--metrics-file", str(tmp_path / where)])
    _assert_refused(r, marker, "--metrics-file")


def test_read_only_directory(shared_dir):
    """A directory the user cannot write in; the marker's directory is writable, so
    only the refusal keeps the child from running (the control run proves it would)."""
    user = "65534" if os.geteuid() == 0 else None     # root ignores mode bits: use nobody
    ro, rw = shared_dir / "ro", shared_dir / "rw"
    ro.mkdir(mode=0o555)
    rw.mkdir()
    os.chmod(rw, 0o777)
    marker = rw / "child-ran"
    r = run_reaper(["--metrics-file", f"{ro}/m.prom", "--", "sh", "-c", f"touch {marker}"], user=user)
    _assert_refused(r, marker, "--metrics-file", "Permission denied")
    control = run_reaper(["--", "sh", "-c", f"touch {marker}"], user=user)
    assert control.proc.returncode == 0 and marker.exists(), control.stderr


def test_good_flags_still_run_the_child(tmp_path):
    """The control: with a free port and a writable path the same command runs."""
    r, marker = _run(tmp_path, ["--metrics-port", str(free_port()), "--metrics-address", "127.0.0.1",
                                "--metrics-file", str(tmp_path / "m.prom")])
    assert r.proc.returncode == 0, r.stderr
    assert marker.exists()
    assert (tmp_path / "m.prom").read_text().startswith("# HELP")
