#!/bin/sh
# Installs and configures a container runtime for tests/test_container.py on a fresh
# Debian bookworm machine, as root. Idempotent. Costs about 10-40 s (apt), plus ~50 s
# the first time the tests build their Debian base root filesystem (cached in
# /var/tmp/reaper-container-cache afterwards).
#
# - podman + runc: crun (podman's default on Debian) fails on the hybrid cgroup
#   v1/v2 layout of these machines, so runc is the runtime;
# - netavark + aardvark-dns (podman's network backend as root) and iptables, for -p;
#   slirp4netns and uidmap for rootless use;
# - fuse-overlayfs: overlay storage where the kernel's overlayfs is not usable;
# - debootstrap: the tests make their image from Debian packages (no registry pulls);
# - catatonit: the init of Podman's default infra (pause) container, built locally by
#   `podman pod create` (tests/test_pod.py); Debian's podman only recommends it.
set -eu

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
    podman runc conmon netavark aardvark-dns containernetworking-plugins iptables \
    slirp4netns uidmap fuse-overlayfs debootstrap catatonit ca-certificates >/dev/null

# Podman raises RLIMIT_NOFILE and RLIMIT_NPROC of every container to 1048576 by
# default; root without CAP_SYS_RESOURCE (as in these VMs) cannot, and runc fails with
# "error setting rlimits for ready process". Give containers the limits we have.
nofile=$(ulimit -Hn)
[ "$nofile" = unlimited ] && nofile=1048576
[ "$nofile" -gt 65536 ] && nofile=65536
mkdir -p /etc/containers/containers.conf.d
cat > /etc/containers/containers.conf.d/50-reaper-ci.conf <<CONF
# Written by reaper's .ci/setup-container-runtime.sh
[containers]
default_ulimits = ["nofile=${nofile}:${nofile}", "nproc=32768:32768"]

[engine]
runtime = "runc"
CONF

podman --version
runc --version | head -1
# A smoke test needs no image: an empty root filesystem with a static binary would
# do, but the host's /bin/true is dynamic; the tests do the real check.
podman info --format '{{.Host.OCIRuntime.Name}} {{.Host.CgroupsVersion}} {{.Store.GraphDriverName}}'
