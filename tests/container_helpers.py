"""A real container runtime for the tests: Podman with runc, and a test image built here.

No image can be pulled on the CI machines, so the image is a root filesystem made
locally, the way docker/Dockerfile.python's final stage makes one:

1. base: Debian bookworm minbase with python3 and pip (debootstrap from the Debian
   mirror; ~45 s), cached across sessions under CACHE keyed by suite and packages;
2. wheels: scripts/build-wheel on a clean copy of the repository (the manylinux wheel
   users install), then `pip wheel` of its dependencies beside it (~15 s; the copy keeps
   build artefacts out of the working tree);
3. image: a copy of the base with the wheels installed by the image's own pip
   (`pip install --no-index --find-links`), cached under CACHE keyed by a hash of
   the sources, so an unchanged tree costs nothing.

Containers run from that directory with `podman run --rootfs DIR:O` (an overlay:
every container gets its own writable layer; the directory is never written).
pytest-xdist workers share one build through a file lock.

Pods (tests/test_pod.py) need an image by name, for every container and for an infra
container of our own: local_image() imports that directory with `podman import` as
localhost/reaper-test:HASH (a few seconds, once per source hash).

Podman's defaults need two adjustments on these machines, made on every call here
(and in .ci/setup-container-runtime.sh for interactive use):
- `--runtime runc`: crun fails on the hybrid cgroup v1/v2 layout;
- `--ulimit nofile=... nproc=...`: Podman raises both limits to 1048576 by default,
  which root without CAP_SYS_RESOURCE cannot do; the container gets this process's
  own limits instead.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import resource
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("REAPER_CONTAINER_CACHE", "/var/tmp/reaper-container-cache"))
SUITE = "bookworm"
MIRROR = os.environ.get("REAPER_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PACKAGES = ("python3", "python3-pip", "procps")
# What scripts/build-wheel needs, as in .dockerignore.
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE", "bin", "reaper", "csrc",
           "scripts/build-wheel")
IMAGE_PYTHON = "/usr/bin/python3"
KEEP_IMAGES = 3                  # older image directories are removed


def missing_tools() -> list:
    return [t for t in ("podman", "runc", "debootstrap") if shutil.which(t) is None]


def podman_base() -> list:
    """podman run's fixed options for these machines."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    nofile = min(hard, 65536)
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 32768)
    return ["podman", "--runtime", "runc", "run", "--ulimit", f"nofile={nofile}:{nofile}",
            "--ulimit", f"nproc={nproc}:{nproc}"]


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run(cmd, **kw) -> None:
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kw)
    if r.returncode != 0:
        tail = r.stdout.decode(errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({r.returncode}):\n{tail}")


def _source_hash() -> str:
    h = hashlib.sha256()
    for top in SOURCES:
        p = REPO / top
        files = [p] if p.is_file() else sorted(q for q in p.rglob("*") if q.is_file()
                                                and q.suffix in (".py", ".c", ".h", ".toml", ".md"))
        for f in files:
            h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def base_rootfs(log=print) -> Path:
    """Debian minbase + python3 + pip, built once and cached."""
    key = hashlib.sha256(f"{SUITE} {' '.join(PACKAGES)}".encode()).hexdigest()[:12]
    final = CACHE / f"base-{SUITE}-{key}"
    if (final / "usr/bin/python3").exists():
        return final
    tmp = CACHE / f"tmp-base-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    try:
        _run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(tmp), MIRROR])
        shutil.rmtree(tmp / "var/cache/apt/archives", ignore_errors=True)
        tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"debootstrap {SUITE} base: {time.monotonic() - t0:.0f}s")
    return final


def build_wheels(dest: Path) -> None:
    src = dest.parent / "src"
    for top in SOURCES:
        p = REPO / top
        if p.is_dir():
            shutil.copytree(p, src / top, ignore=shutil.ignore_patterns(
                "__pycache__", "*.so", "*.o", "*.pyc", "_core.c"))
        else:
            (src / top).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, src / top)
    # As docker/Dockerfile.python's builder stage: the release wheel, then its dependencies.
    _run([str(src / "scripts/build-wheel")], env={**os.environ, "OUT": str(dest), "PYTHON": sys.executable,
                                                  "PLATFORMS": "manylinux2014_x86_64"}, timeout=600)
    for sdist in dest.glob("*.tar.gz"):
        sdist.unlink()
    (wheel,) = dest.glob("reaper_init-*.whl")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(dest), str(wheel)], timeout=600)
    shutil.rmtree(src, ignore_errors=True)


def image_rootfs(log=print) -> Path:
    """The image directory: base + reaper installed from wheels. Safe across xdist workers."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with _locked(CACHE / ".lock"):
        base = base_rootfs(log)
        final = CACHE / f"image-{_source_hash()}"
        if (final / "usr/local/bin/reaper").exists():
            os.utime(final)
            return final
        t0 = time.monotonic()
        tmp = CACHE / f"tmp-image-{uuid.uuid4().hex[:8]}"
        try:
            _run(["cp", "-a", "--reflink=auto", str(base), str(tmp)])
            build_wheels(tmp / "wheels")
            (wheel,) = (tmp / "wheels").glob("reaper_init-*-manylinux*.whl")
            # The image's own pip installs them, as the Dockerfile's final stage does.
            _run(["chroot", str(tmp), IMAGE_PYTHON, "-m", "pip", "install", "-q", "--no-index",
                  "--no-cache-dir", "--break-system-packages", "--find-links", "/wheels",
                  f"/wheels/{wheel.name}"])
            shutil.rmtree(tmp / "wheels")
            _run(["chroot", str(tmp), "/usr/local/bin/reaper", "--version"])
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log(f"test image {final.name}: {time.monotonic() - t0:.0f}s")
        _prune(final)
        return final


def _prune(keep: Path) -> None:
    images = sorted(CACHE.glob("image-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in images[KEEP_IMAGES:]:
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)


IMAGE_REPO = "localhost/reaper-test"


def local_image(log=print) -> str:
    """The test image as a Podman image (podman import of image_rootfs()); its name."""
    rootfs = image_rootfs(log)
    name = f"{IMAGE_REPO}:{rootfs.name[len('image-'):]}"
    with _locked(CACHE / ".import-lock"):
        if subprocess.run(["podman", "image", "exists", name], timeout=60).returncode == 0:
            return name
        t0 = time.monotonic()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            _run(["podman", "import", "-", name], stdin=tar.stdout, timeout=300)
        finally:
            tar.stdout.close()
            tar.wait(60)
        log(f"podman import {name}: {time.monotonic() - t0:.0f}s")
        # Older imports of this test image go; only ours are named localhost/reaper-test.
        r = subprocess.run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}}", IMAGE_REPO],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=60)
        for old in r.stdout.decode().split():
            if old != name and not (CACHE / f"image-{old.rpartition(':')[2]}").exists():
                subprocess.run(["podman", "rmi", old], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=60)
    return name


class Pod:
    """A Podman pod whose containers share one PID namespace, as a Kubernetes pod with
    shareProcessNamespace: true. The infra container is PID 1 of that namespace (Podman's
    pause image, built from catatonit, unless infra_image/infra_command say otherwise) and
    holds the network namespace, where `publish` ports go."""

    SHARE = "pid,net,ipc,uts"

    def __init__(self, *, publish=(), infra_image=None, infra_command=None):
        self.name = f"reaper-test-pod-{uuid.uuid4().hex[:12]}"
        cmd = ["podman", "--runtime", "runc", "pod", "create", "--name", self.name, "--share", self.SHARE]
        for host_port, port in publish:
            cmd += ["-p", f"127.0.0.1:{host_port}:{port}"]
        if infra_image:
            cmd += ["--infra-image", infra_image]
        if infra_command:
            cmd += ["--infra-command", infra_command]
        _run(cmd, timeout=120)

    def run(self, image: str, argv: list, *, name: str, volumes=(), user=None) -> str:
        """Starts a container in the pod (detached); returns its name."""
        cname = f"{self.name}-{name}"
        cmd = [*podman_base(), "-d", "--pod", self.name, "--name", cname]
        for host, inside in volumes:
            cmd += ["-v", f"{host}:{inside}"]
        if user:
            cmd += ["--user", user]
        _run([*cmd, image, *argv], timeout=120)
        return cname

    def stop(self, cname: str, timeout: int = 10) -> int:
        """`podman stop -t TIMEOUT` of one container; its exit code."""
        _run(["podman", "stop", "-t", str(timeout), cname], timeout=timeout + 60)
        r = subprocess.run(["podman", "wait", cname], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=60)
        return int(r.stdout.split()[-1])

    def logs(self, cname: str) -> str:
        r = subprocess.run(["podman", "logs", cname], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=60)
        return r.stdout.decode(errors="replace")

    def remove(self) -> None:
        subprocess.run(["podman", "pod", "rm", "-f", "-t", "0", self.name], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=120)


class Container:
    """One `podman run --rootfs` in the foreground: .proc is podman run, whose exit
    status is the container's."""

    def __init__(self, rootfs: Path, argv: list, *, volumes=(), publish=(), user=None, env=None,
                 name=None):
        self.name = name or f"reaper-test-{uuid.uuid4().hex[:12]}"
        cmd = [*podman_base(), "--rm", "--name", self.name, "--network",
               "bridge" if publish else "none"]
        for host, inside in volumes:
            cmd += ["-v", f"{host}:{inside}"]
        for host_port, port in publish:
            cmd += ["-p", f"127.0.0.1:{host_port}:{port}"]
        if user:
            cmd += ["--user", user]
        for k, v in (env or {}).items():
            cmd += ["-e", f"{k}={v}"]
        cmd += ["--rootfs", f"{rootfs}:O", *argv]
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.stdout = self.stderr = ""

    def running(self) -> bool:
        r = subprocess.run(["podman", "container", "inspect", "--format", "{{.State.Running}}", self.name],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        return r.stdout.strip() == b"true"

    def stop(self, timeout: int) -> subprocess.CompletedProcess:
        """`podman stop -t TIMEOUT`: SIGTERM to PID 1, SIGKILL after TIMEOUT seconds."""
        return subprocess.run(["podman", "stop", "-t", str(timeout), self.name],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout + 30)

    def wait(self, timeout: float = 60) -> int:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"container {self.name} did not exit within {timeout}s")
        self.stdout, self.stderr = out.decode(errors="replace"), err.decode(errors="replace")
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            subprocess.run(["podman", "rm", "-f", "-t", "0", self.name], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=60)
            out, err = self.proc.communicate(timeout=30)
            self.stdout, self.stderr = out.decode(errors="replace"), err.decode(errors="replace")


def run(rootfs: Path, argv: list, timeout: float = 60, **kw) -> Container:
    c = Container(rootfs, argv, **kw)
    c.wait(timeout)
    return c


if __name__ == "__main__":     # build (or find) the image: python tests/container_helpers.py
    print(image_rootfs())


@pytest.fixture
def out(tmp_path):
    """A directory shared with the container (as /out), writable by any uid."""
    d = tmp_path / "out"
    d.mkdir()
    d.chmod(0o777)
    return d
