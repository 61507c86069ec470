"""`reaper watch` as the sidecar of a real Podman pod with a shared PID namespace.

The pod is what Kubernetes makes of docker/k8s/sidecar.yaml (shareProcessNamespace: true):
`podman pod create --share pid,net,ipc,uts`, whose infra container is PID 1 of the PID
namespace every container of the pod joins and holds the network namespace where the
sidecar's port is published. In it, a job container whose PID 1 never waits for its
children (they stay zombies; the orphans it makes go to the pod's PID 1), and the sidecar,
`reaper watch` as uid 1000 from the test image (container_helpers, imported with
`podman import`: nothing can be pulled here). The sidecar's numbers are read over a real
scrape of the published port.

The infra container is Podman's default pause image (podman builds it locally from
catatonit, which .ci/setup-container-runtime.sh installs), or reaper's own pause mode
(`reaper -P`) from the test image, where reaper has one.
"""
from __future__ import annotations

import subprocess

import pytest

from conftest import REAPER, free_port, require, wait_for, wait_for_file
from container_helpers import Pod, local_image, missing_tools, out  # noqa: F401  (out: a fixture)
from metrics_helpers import scrape, wait_healthy, wait_scrape

pytestmark = pytest.mark.container

ZOMBIES = 4     # children of the job that exit at once: zombies, since the job never waits
ORPHANS = 3     # children that fork a grandchild and exit: zombies too; the grandchildren
                # become orphans, re-parented to the pod's PID 1, which must reap them

# The job container's PID 1. Each grandchild waits (pidfd) until its parent has exited, so
# it has been re-parented, records its pid and its new parent, then exits.
JOB = r"""
import ctypes, os, select, sys, time
ctypes.CDLL(None).prctl(15, b"zombiemaker", 0, 0, 0)     # PR_SET_NAME: the metric's parent_name
for _ in range(%(zombies)d):
    if os.fork() == 0:
        os._exit(0)
for i in range(%(orphans)d):
    if os.fork() == 0:
        if os.fork() == 0:
            fd = os.pidfd_open(os.getppid())
            select.select([fd], [], [], 30)               # readable once the parent has exited
            with open(f"/out/orphan-{i}.tmp", "w") as f:
                f.write(f"{os.getpid()} {os.getppid()}")
            os.rename(f"/out/orphan-{i}.tmp", f"/out/orphan-{i}")
            os._exit(0)
        os._exit(0)
with open("/out/job.tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename("/out/job.tmp", "/out/job")
time.sleep(3600)
""" % {"zombies": ZOMBIES, "orphans": ORPHANS}


def _pause_mode() -> bool:
    r = subprocess.run([REAPER, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
    return any(line.split(",")[0].strip() == "-P" for line in r.stdout.decode().splitlines())


@pytest.fixture(scope="session")
def image():
    missing = missing_tools()
    require(", ".join(missing), not missing, "run .ci/setup-container-runtime.sh as root")
    return local_image(log=lambda msg: None)


@pytest.fixture
def pods():
    made = []

    def make(**kw):
        p = Pod(**kw)
        made.append(p)
        return p
    yield make
    for p in made:
        p.remove()


def _infra(kind: str, image: str) -> dict:
    if kind == "catatonit":
        return {}
    if not _pause_mode():
        pytest.skip("reaper has no pause mode (-P) yet: nothing to run as the pod's infra command")
    return {"infra_image": image, "infra_command": "reaper -P"}


def _in_pod(container: str, code: str, *args) -> str:
    """Runs a Python snippet in a container of the pod (it sees the pod's PID namespace)."""
    r = subprocess.run(["podman", "exec", container, "/usr/bin/python3", "-c", code, *map(str, args)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r.stdout.decode()


@pytest.mark.parametrize("infra", ["catatonit", "reaper-pause"])
def test_watch_sidecar_reports_the_jobs_zombies_and_the_infra_reaps_its_orphans(image, out, pods, infra):
    port = free_port()
    pod = pods(publish=[(port, 9259)], **_infra(infra, image))
    job = pod.run(image, ["/usr/bin/python3", "-c", JOB], name="job", volumes=[(out, "/out")])
    watch = pod.run(image, ["reaper", "watch", "--metrics-port", "9259"], name="watch", user="1000:100")
    job_pid = wait_for_file(out / "job", 60)
    orphans = [wait_for_file(out / f"orphan-{i}", 30).split() for i in range(ORPHANS)]
    # Re-parented to the pod's PID 1 (the infra container), not to the job or its runtime.
    assert all(new_parent == "1" for _, new_parent in orphans), orphans
    pid1 = _in_pod(job, "print(open('/proc/1/cmdline').read().replace(chr(0), ' '))")
    assert ("catatonit" if infra == "catatonit" else "reaper") in pid1, pid1
    wait_healthy(port, 60)

    expected = ZOMBIES + ORPHANS
    s = wait_scrape(port, lambda s: s.value("reaper_zombies") == expected, f"{expected} zombies", timeout=30)
    by_parent = s.samples("reaper_zombies_by_parent")
    assert [(z.labels, z.value) for z in by_parent] == \
        [({"parent_pid": job_pid, "parent_name": "zombiemaker"}, expected)]
    assert s.value("reaper_zombie_oldest_age_seconds") > 0
    assert s.value("reaper_build_info", mode="watch") == 1
    watch_pid = s.value("reaper_pid")
    assert watch_pid not in (None, 1)
    # Live in the namespace: the pod's PID 1 and the job (the sidecar does not count itself).
    assert s.value("reaper_processes", **{"class": "all"}) == 2
    assert s.total("reaper_reaped_total") is None                 # the sidecar reaps nothing

    # The infra reaped the orphans: none of them is left in the namespace, zombie or not.
    left = "import os, sys; print(sum(os.path.exists(f'/proc/{p}') for p in sys.argv[1:]))"
    pids = [pid for pid, _ in orphans]
    wait_for(lambda: _in_pod(watch, left, *pids).strip() == "0", 30, interval=0.1,
             what="the orphans to be reaped by the pod's PID 1")
    # The job's own zombies are still there: nothing reaped what was not its own.
    assert scrape(port).value("reaper_zombies") == expected

    assert pod.stop(watch, 10) == 0, pod.logs(watch)                # SIGTERM: a clean exit 0
    assert "Traceback" not in pod.logs(watch)
