"""Bad metrics flags: one clear line, exit 2, and the child never starts."""
import os

import pytest

from conftest import free_port, refused, run_reaper


# A port in use and an address not (yet) on this host are no usage errors: reaper starts
# the child and retries the bind (tests/test_metrics_port_retry.py).

@pytest.mark.parametrize("address,words", [
    ("256.1.1.1", ["bad address", "256.1.1.1"]),          # refused by the parser: no DNS lookup
    ("not an address!", ["bad address"]),
])
def test_bad_address(tmp_path, address, words):
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
