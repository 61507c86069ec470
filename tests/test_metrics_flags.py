"""Bad metrics flags: one clear line, exit 2, and the child never starts."""
import os
import socket

import pytest

from conftest import free_port, refused, run_reaper


def test_port_in_use(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        # reaper runs in a fresh PID namespace but the same network namespace.
        refused(tmp_path, ["--metrics-port", str(port), "--metrics-address", "127.0.0.1"], "in use", str(port))


def _foreign_address() -> str:
    """An address of TEST-NET-1 (RFC 5737, never assigned) that this host does not hold:
    checked, not assumed."""
    for last in range(1, 255):
        address = f"192.0.2.{last}"
        with socket.socket() as s:
            try:
                s.bind((address, 0))
            except OSError:
                return address
    pytest.skip("this host holds every address of 192.0.2.0/24")


@pytest.mark.parametrize("address,words", [
    ("256.1.1.1", ["bad address", "256.1.1.1"]),          # refused by the parser: no DNS lookup
    ("not an address!", ["bad address"]),
    ("foreign", ["not an address of this host"]),
])
def test_bad_address(tmp_path, address, words):
    address = _foreign_address() if address == "foreign" else address
    refused(tmp_path, ["--metrics-port", str(free_port()), "--metrics-address", address], *words)


def test_bad_address_from_environment(tmp_path):
    refused(tmp_path, [], "999.0.0.1", env={"REAPER_METRICS_PORT": str(free_port()),
                                            "REAPER_METRICS_ADDRESS": "999.0.0.1"})


@pytest.mark.parametrize("where", ["missing-dir/m.prom", "a-directory"])
def test_unwritable_metrics_file(tmp_path, where):
    (tmp_path / "a-directory").mkdir()
    refused(tmp_path, ["--metrics-file", str(tmp_path / where)], "--metrics-file")


def test_read_only_directory(shared_dir):
    """A directory the user cannot write in; the marker's directory is writable, so
    only the refusal keeps the child from running (the control run proves it would)."""
    user = "65534" if os.geteuid() == 0 else None     # root ignores mode bits: use nobody
    ro, rw = shared_dir / "ro", shared_dir / "rw"
    ro.mkdir(mode=0o555)
    rw.mkdir()
    os.chmod(rw, 0o777)
    refused(rw, ["--metrics-file", f"{ro}/m.prom"], "--metrics-file", "Permission denied", user=user)
    marker = rw / "child-ran"
    control = run_reaper(["--", "sh", "-c", f"touch {marker}"], user=user)
    assert control.proc.returncode == 0 and marker.exists(), control.stderr


def test_good_flags_still_run_the_child(tmp_path):
    """The control: with a free port and a writable path the same command runs."""
    marker = tmp_path / "child-ran"
    r = run_reaper(["--metrics-port", str(free_port()), "--metrics-address", "127.0.0.1",
                    "--metrics-file", str(tmp_path / "m.prom"), "--", "touch", str(marker)])
    assert r.proc.returncode == 0, r.stderr
    assert marker.exists()
    assert (tmp_path / "m.prom").read_text().startswith("# HELP")
