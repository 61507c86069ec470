"""The shipped Dockerfiles and Kubernetes manifests say what the docs say.

Parsed, not applied (no cluster here): every manifest loads; reaper is PID 1 of the
Ray containers and its command line parses with reaper's own option parser; Ray
ends up as the main child through KubeRay's generated command; port names fit
Kubernetes' 15-character limit and the port numbers match reaper's settings; the
grace periods nest; the PodMonitors scrape ports that exist; the sidecar shares
the PID namespace and runs `reaper watch`; the PrometheusRule and the dashboard
ConfigMap match docs/ (docker/k8s/generate.py). The reaper node DaemonSet: hostPID, the
host's /proc and /sys read-only and passed as --proc/--sys, no privilege, every node,
requests, limits and a probe; its PodMonitor labels the series by node; and its
command, run as the manifest's user without capabilities, names a root process that
burns a core in the kernel and ends within the grace period.
"""
from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest


pytestmark = pytest.mark.yaml


@pytest.fixture(autouse=True)
def _needs_yaml():
    require("pyyaml", importable("yaml"), "pip install -e '.[test]'")

from reaper import options  # noqa: E402
from conftest import importable, require, yaml_module  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
K8S = REPO / "docker" / "k8s"
REAPER_ENV = {var for o in options.OPTIONS for var in o.env}
RAY_METRICS_PORT = 8080
KUBERAY_EXEC = 'exec bash -c "$KUBERAY_GEN_RAY_START_CMD"'
# KubeRay's limit (RAY_START_ULIMIT_OPEN_FILES, else 65536) where the hard limit allows it,
# else the hard limit: never "cannot modify limit".
ULIMIT = 'ulimit -n ${RAY_START_ULIMIT_OPEN_FILES:-65536} 2>/dev/null || ulimit -n "$(ulimit -Hn)"; '


def _docs(name: str) -> list:
    return [d for d in yaml_module().safe_load_all((K8S / name).read_text()) if d]


def _templates(cluster: dict) -> dict:
    """node type -> list of pod templates"""
    spec = cluster["spec"]
    return {"head": [spec["headGroupSpec"]["template"]],
            "worker": [g["template"] for g in spec["workerGroupSpecs"]]}


def _env(container: dict) -> dict:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def _ports(container: dict) -> dict:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def _ray_container(template: dict) -> dict:
    return next(c for c in template["spec"]["containers"] if c["name"].startswith("ray-"))


# --- Dockerfiles ----------------------------------------------------------------------

def _dockerfile(name: str) -> dict:
    text = (REPO / "docker" / name).read_text()
    text = re.sub(r"\\\n", " ", text)
    out = {"ENV": {}, "EXPOSE": [], "ARG": {}}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word == "ENV":
            out["ENV"].update(dict(kv.split("=", 1) for kv in shlex.split(rest)))
        elif word == "EXPOSE":
            out["EXPOSE"] += [int(p.split("/")[0]) for p in rest.split()]
        elif word == "ARG":
            k, _, v = rest.partition("=")
            out["ARG"].setdefault(k, v)
        elif word in ("ENTRYPOINT", "CMD"):
            out[word] = json.loads(rest)
        out.setdefault("FROM", [])
        if word == "FROM":
            out["FROM"].append(rest)
    return out


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.python"])
def test_dockerfiles(name):
    d = _dockerfile(name)
    assert d["ENTRYPOINT"] == ["reaper", "--"]
    assert len(d["FROM"]) == 2 and d["FROM"][0].endswith(" AS builder")     # builder, then final
    # Every REAPER_* default is a real option and parses.
    assert set(d["ENV"]) <= REAPER_ENV, set(d["ENV"]) - REAPER_ENV
    cfg = options.parse(["true"], environ=d["ENV"])
    assert cfg.metrics_port == options.DEFAULT_METRICS_PORT
    assert d["EXPOSE"] == [cfg.metrics_port]
    # reaper top works in the image (the docs show it in every pod): the [top] extra
    text = (REPO / "docker" / name).read_text()
    assert ("'/src[top]'" in text) and (name == "Dockerfile.python" or "'reaper-init[top]'" in text)
    if name == "Dockerfile.python":     # the runtime only: no installer copied into the final stage
        assert re.search(r"pip uninstall [^\n]*setuptools wheel pip", text)
    if name == "Dockerfile":
        assert re.fullmatch(r"rayproject/ray:2\.\d+\.\d+-py3\d+(-\w+)?", d["ARG"]["BASE_IMAGE"])
        assert cfg.budgets_enabled and cfg.budget_action in options.BUDGET_ACTIONS


def test_readme_links_are_absolute_into_the_repository():
    """PyPI shows README.md away from the repository: every link is absolute, and one into
    the repository (pyproject.toml's Source URL) names a file that exists."""
    source = re.search(r'^Source = "(https://[^"]+)"$', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    links = re.findall(r"\]\(([^)\s]+)\)", (REPO / "README.md").read_text())
    assert len(links) >= 15
    for link in links:
        assert link.startswith("https://"), link
        if link.startswith(source + "/"):
            path = re.fullmatch(re.escape(source) + r"/(?:blob|tree)/main/([^#]+)(#.*)?", link).group(1)
            assert (REPO / path).exists(), link


def test_dockerfile_python_needs_nothing_of_debians_python3():
    """Debian's python3 has no headers and refuses pip installs (PEP 668): the builder adds
    the headers and venv when missing and builds reaper in a virtualenv of its own, which
    the final stage copies; nothing is pip-installed into the image's Python.
    .ci/check-image builds and runs it on Debian's python3."""
    text = (REPO / "docker/Dockerfile.python").read_text()
    builder, final = text.split("\nFROM ${BASE_IMAGE}\n")
    assert "python3-dev" in builder and "python3-venv" in builder
    assert "python3 -m venv /opt/reaper" in builder
    assert "COPY --from=builder /opt/reaper /opt/reaper" in final
    assert "pip install" not in final and "--break-system-packages" not in text


def test_dockerignore_keeps_build_artefacts_out():
    ignored = (REPO / ".dockerignore").read_text().split()
    for pattern in ("build", "**/*.so", "**/*.egg-info", ".git"):
        assert pattern in ignored


# --- the RayCluster with reaper as PID 1 ---------------------------------------------------

def test_raycluster_runs_reaper_as_pid1_with_ray_as_its_main_child():
    (cluster,) = _docs("raycluster.yaml")
    assert cluster["kind"] == "RayCluster"
    assert cluster["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    image_ray = set()
    for node_type, templates in _templates(cluster).items():
        for t in templates:
            c = _ray_container(t)
            env = _env(c)
            assert set(k for k in env if k.startswith("REAPER_")) <= REAPER_ENV
            assert c["command"][0] == "reaper" and "args" not in c
            cfg = options.parse(c["command"][1:], environ=env)
            # bash sets the ulimit KubeRay would have set, then execs `ray start` as
            # parsed by a shell (quoted rayStartParams survive), so Ray is the main child.
            assert cfg.command[:2] == ["bash", "-c"] and len(cfg.command) == 3
            script = cfg.command[2]
            assert script.startswith(ULIMIT) and script.endswith(KUBERAY_EXEC)
            assert 143 in cfg.remap_exit and cfg.exit_zero_on_stop
            # Grace periods nest: Ray's drain, then reaper's grace, inside the pod's.
            drain = float(env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"])
            assert t["spec"]["terminationGracePeriodSeconds"] > drain + cfg.grace
            # Ports: unique names <= 15 characters, Ray's and reaper's side by side.
            ports = _ports(c)
            assert len(ports) == len(c["ports"]) and len(set(ports.values())) == len(ports)
            assert all(len(n) <= 15 and re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", n) for n in ports)
            assert ports["metrics"] == RAY_METRICS_PORT
            assert ports["reaper-metrics"] == cfg.metrics_port != RAY_METRICS_PORT
            if node_type == "head":
                assert {"as-metrics", "dash-metrics"} <= set(ports)
            image_ray.add(c["image"].rpartition(":")[2].split("-")[0])
    assert image_ray == {cluster["spec"]["rayVersion"]}


# --- the sidecar ---------------------------------------------------------------------------

SIDECARS = {"sidecar.yaml": "initContainers", "sidecar-pre-1.29.yaml": "containers"}


@pytest.mark.parametrize("name", sorted(SIDECARS))
def test_sidecar_shares_the_pid_namespace_and_runs_reaper_watch(monkeypatch, name):
    from reaper import commands

    (cluster,) = _docs(name)
    assert "ray.io/overwrite-container-cmd" not in cluster["metadata"].get("annotations", {})
    for templates in _templates(cluster).values():
        for t in templates:
            spec = t["spec"]
            assert spec["shareProcessNamespace"] is True
            (side,) = [c for c in spec.get(SIDECARS[name], []) if c.get("command", [])[:2] == ["reaper", "watch"]]
            if SIDECARS[name] == "initContainers":
                # a native sidecar (Kubernetes >= 1.29): starts before Ray, stops after it
                assert side["restartPolicy"] == "Always"
                assert spec["initContainers"] == [side]
            else:
                assert "restartPolicy" not in side
            env = _env(side)
            assert set(env) <= REAPER_ENV
            for k in REAPER_ENV:
                monkeypatch.delenv(k, raising=False)
            for k, v in env.items():
                monkeypatch.setenv(k, v)
            cfg = commands._watch_config(side["command"][2:])
            assert _ports(side) == {"reaper-metrics": cfg.metrics_port}
            assert side["securityContext"]["runAsUser"] == 1000         # Ray's uid
            ray = _ray_container(t)
            assert "command" not in ray                                   # KubeRay's own command
            assert set(_ports(ray)).isdisjoint(_ports(side))
            drain = float(_env(ray)["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"])
            assert spec["terminationGracePeriodSeconds"] > drain


def test_the_pre_129_sidecar_is_the_native_one_with_reaper_as_a_container():
    """The two sidecar examples differ only in where reaper watch is."""
    (native,) = _docs("sidecar.yaml")
    (old,) = _docs("sidecar-pre-1.29.yaml")
    for templates in _templates(native).values():
        for t in templates:
            spec = t["spec"]
            (side,) = spec.pop("initContainers")
            del side["restartPolicy"]
            spec["containers"].append(side)
    assert native == old


# --- Pod Security "restricted" --------------------------------------------------------------
# The rules of the Pod Security Standards (kubernetes.io/docs/concepts/security/
# pod-security-standards/, v1.33), baseline's and restricted's, as the admission
# controller applies them to a pod spec. Each returns what breaks it.

RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}
BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
                 "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}


def _pod_security(spec: dict) -> set:
    """What of spec breaks "restricted" (and so also what breaks "baseline": those
    rule names start with baseline-)."""
    broken = set()
    pod = spec.get("securityContext", {})
    containers = [*spec.get("initContainers", []), *spec.get("containers", []), *spec.get("ephemeralContainers", [])]
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(host):
            broken.add(f"baseline-{host}")
    for v in spec.get("volumes", []):
        kind = next(k for k in v if k != "name")
        if kind == "hostPath":
            broken.add("baseline-hostPath")
        if kind not in RESTRICTED_VOLUMES:
            broken.add(f"volume-{kind}")
    if pod.get("seccompProfile", {}).get("type") == "Unconfined":
        broken.add("baseline-seccomp")
    if pod.get("runAsUser") == 0:
        broken.add("runAsUser-0")
    for c in containers:
        sc = c.get("securityContext", {})
        caps = sc.get("capabilities", {})
        if sc.get("privileged"):
            broken.add("baseline-privileged")
        if set(caps.get("add", [])) - BASELINE_CAPS:
            broken.add("baseline-capabilities")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            broken.add("baseline-hostPort")
        if sc.get("procMount", "Default") != "Default":
            broken.add("baseline-procMount")
        if sc.get("allowPrivilegeEscalation") is not False:
            broken.add(f"allowPrivilegeEscalation:{c['name']}")
        if "ALL" not in caps.get("drop", []) or set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            broken.add(f"capabilities:{c['name']}")
        if sc.get("runAsNonRoot") is False or not (sc.get("runAsNonRoot") or pod.get("runAsNonRoot")):
            broken.add(f"runAsNonRoot:{c['name']}")
        if sc.get("runAsUser") == 0:
            broken.add(f"runAsUser-0:{c['name']}")
        seccomp = sc.get("seccompProfile", pod.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            broken.add(f"seccomp:{c['name']}")
    return broken


def _pod_specs(name: str) -> list:
    specs = []
    for d in _docs(name):
        if d["kind"] == "RayCluster":
            specs += [t["spec"] for ts in _templates(d).values() for t in ts]
        elif d["kind"] == "DaemonSet":
            specs.append(d["spec"]["template"]["spec"])
    return specs


@pytest.mark.parametrize("name", ["raycluster.yaml", "sidecar.yaml", "sidecar-pre-1.29.yaml"])
def test_ray_pods_fit_pod_security_restricted(name):
    specs = _pod_specs(name)
    assert len(specs) == 2
    for spec in specs:
        assert _pod_security(spec) == set(), name
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            # no capability added back: reaper needs none where it runs as Ray's uid
            assert "add" not in c["securityContext"].get("capabilities", {}), c["name"]
            if c.get("command", [])[:2] == ["reaper", "watch"]:
                assert c["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_node_daemonset_breaks_only_baselines_host_rules():
    """reaper node needs the host's pids and files (hostPID, hostPath): nothing else of
    "restricted" is given up."""
    (spec,) = _pod_specs("reaper-node.yaml")
    assert _pod_security(spec) == {"baseline-hostPID", "baseline-hostPath", "volume-hostPath"}


def test_the_pod_security_check_finds_what_breaks_restricted():
    (cluster,) = _docs("raycluster.yaml")
    spec = _templates(cluster)["head"][0]["spec"]
    c = spec["containers"][0]["securityContext"]
    c["capabilities"]["add"] = ["SYS_NICE"]
    c["allowPrivilegeEscalation"] = True
    spec["securityContext"]["seccompProfile"]["type"] = "Unconfined"
    del spec["securityContext"]["runAsNonRoot"]
    assert _pod_security(spec) == {"capabilities:ray-head", "allowPrivilegeEscalation:ray-head",
                                   "baseline-seccomp", "seccomp:ray-head", "runAsNonRoot:ray-head",
                                   "baseline-capabilities"}


# --- monitoring ----------------------------------------------------------------------------

@pytest.mark.parametrize("cluster_file", ["raycluster.yaml", "sidecar.yaml", "sidecar-pre-1.29.yaml"])
def test_podmonitors_scrape_ports_that_exist(cluster_file):
    (cluster,) = _docs(cluster_file)
    monitors = _docs("podmonitor.yaml")
    covered = set()
    for m in monitors:
        assert m["kind"] == "PodMonitor"
        node_type = m["spec"]["selector"]["matchLabels"]["ray.io/node-type"]
        covered.add(node_type)
        endpoints = m["spec"]["podMetricsEndpoints"]
        wanted = [e["port"] for e in endpoints]
        assert "reaper-metrics" in wanted and "metrics" in wanted
        for e in endpoints:
            (relabel,) = [r for r in e["relabelings"] if r.get("targetLabel") == "ray_io_cluster"]
            assert relabel["sourceLabels"] == ["__meta_kubernetes_pod_label_ray_io_cluster"]
            # the node, as reaper node's PodMonitor names it: the dashboard's node variable
            (relabel,) = [r for r in e["relabelings"] if r.get("targetLabel") == "node"]
            assert relabel["sourceLabels"] == ["__meta_kubernetes_pod_node_name"]
        for t in _templates(cluster)[node_type]:
            names = set()
            for c in [*t["spec"].get("initContainers", []), *t["spec"]["containers"]]:
                names |= set(_ports(c))     # Prometheus finds an init container's ports too
            assert set(wanted) <= names, (node_type, set(wanted) - names)
    assert covered == {"head", "worker"}


def _generator():
    spec = importlib.util.spec_from_file_location("k8s_generate", K8S / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_prometheusrule_and_dashboard_match_docs():
    gen = _generator()
    for name, (make, _src) in gen.OUTPUTS.items():
        (shipped,) = _docs(name)
        assert shipped == make(), f"docker/k8s/{name} is stale: run python docker/k8s/generate.py"
    (rule,) = _docs("prometheusrule.yaml")
    assert rule["spec"]["groups"] == yaml_module().safe_load((REPO / "docs/alerts.yml").read_text())["groups"]
    (cm,) = _docs("grafana-dashboard-configmap.yaml")
    assert json.loads(cm["data"]["reaper.json"]) == json.loads((REPO / "docs/grafana-dashboard.json").read_text())


def test_every_manifest_parses():
    files = sorted(K8S.glob("*.yaml"))
    assert len(files) >= 5
    for f in files:
        for d in _docs(f.name):
            assert {"apiVersion", "kind", "metadata"} <= set(d), f.name


def test_the_kuberay_command_makes_the_generated_command_reapers_main_child(tmp_path):
    """The manifest's command, run for real with a stand-in for KubeRay's generated
    `ray start ...`: after the ulimit and two execs it is reaper's main child, and a
    quoted JSON argument (as rayStartParams may hold) reaches it intact."""
    from conftest import PYTHON, free_port, run_reaper

    (cluster,) = _docs("raycluster.yaml")
    c = _ray_container(_templates(cluster)["worker"][0])
    probe = tmp_path / "probe.py"
    probe.write_text("import json, os, sys\n"
                     "print(json.dumps({'pid': os.getpid(), 'ppid': os.getppid(), 'argv': sys.argv[1:]}))\n")
    generated = f"""{PYTHON} {probe} start --block --resources='{{"GPU": 1}}'"""
    argv = c["command"][1:]          # without "reaper": run_reaper adds it
    env = {**_env(c), "KUBERAY_GEN_RAY_START_CMD": generated, "REAPER_METRICS_PORT": str(free_port()),
           "REAPER_METRICS_ADDRESS": "127.0.0.1"}
    r = run_reaper(argv, env=env, timeout=30)
    assert r.proc.returncode == 0, r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["ppid"] == 1 and seen["pid"] == 2        # the main child itself, under reaper as PID 1
    assert seen["argv"] == ["start", "--block", '--resources={"GPU": 1}']


def test_every_subpackage_ships_in_the_wheel():
    """pyproject.toml lists the packages by hand (no package discovery): a subpackage
    left out would be missing from the wheel and sdist installs."""
    root = Path(__file__).resolve().parents[1]
    listed = re.search(r"^packages = \[(.*)\]$", (root / "pyproject.toml").read_text(), re.M).group(1)
    listed = {name.strip().strip('"') for name in listed.split(",")}
    found = {".".join(d.relative_to(root).parts) for d in (root / "reaper").rglob("*")
             if d.is_dir() and (d / "__init__.py").exists()} | {"reaper"}
    assert listed == found, f"pyproject.toml's packages: missing {sorted(found - listed)}, extra {sorted(listed - found)}"


# --- reaper node: the DaemonSet and its PodMonitor -------------------------------------------

def _daemonset() -> tuple:
    docs = _docs("reaper-node.yaml")
    (ns,) = [d for d in docs if d["kind"] == "Namespace"]
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    assert len(docs) == 2
    return ns, ds


def _node_container(ds: dict) -> dict:
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    return c


def _host_mounts(ds: dict) -> dict:
    """host path -> the container's mount of it (mountPath, readOnly, ...)."""
    spec = ds["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {}
    for m in _node_container(ds).get("volumeMounts", []):
        mounts[volumes[m["name"]]["hostPath"]["path"]] = m
    assert len(mounts) == len(volumes), "a volume that is not a host path, or not mounted"
    return mounts


def _node_config(ds: dict, monkeypatch):
    """The container's `reaper node` arguments as reaper node parses them, the host's
    /proc and /sys mount points standing for this machine's /proc and /sys (its parser
    wants directories that exist)."""
    from reaper.commands import node

    c = _node_container(ds)
    assert c["command"][:2] == ["reaper", "node"] and "args" not in c
    where = {m["mountPath"]: host for host, m in _host_mounts(ds).items()}
    for k in REAPER_ENV:
        monkeypatch.delenv(k, raising=False)
    cfg = node.config([where.get(a, a) for a in c["command"][2:]], environ=_env(c))
    return cfg, c["command"][2:]


def _quantity(q: str) -> float:
    """A Kubernetes quantity of CPU or memory: "250m" cores, "48Mi" bytes."""
    units = {"m": 1e-3, "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "k": 1e3, "M": 1e6, "G": 1e9}
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(q))
    assert m and (m.group(2) in units or not m.group(2)), q
    return float(m.group(1)) * units.get(m.group(2), 1)


def test_reaper_node_reads_the_hosts_proc_and_sys_read_only(monkeypatch):
    _ns, ds = _daemonset()
    spec = ds["spec"]["template"]["spec"]
    # the host's PID namespace for the sampler's pids, its network namespace for the NICs' counters
    assert spec["hostPID"] is True and spec["hostNetwork"] is True
    assert not spec.get("hostIPC")
    mounts = _host_mounts(ds)
    assert set(mounts) == {"/proc", "/sys"}, "host paths other than /proc and /sys"
    for host, m in mounts.items():
        assert m["readOnly"] is True, host
        assert m["mountPath"] not in ("/proc", "/sys"), "over the container's own"
    cfg, argv = _node_config(ds, monkeypatch)
    # passed as --proc and --sys, where they are mounted
    assert argv[argv.index("--proc") + 1] == mounts["/proc"]["mountPath"]
    assert argv[argv.index("--sys") + 1] == mounts["/sys"]["mountPath"]
    assert (cfg.node_proc, cfg.node_sys) == ("/proc", "/sys")          # as parsed, mapped to here
    assert cfg.node_diagnose is None and not cfg.metrics_file
    assert cfg.node_kmsg == ""          # /dev/kmsg is a device only a privileged container may open


def test_reaper_node_runs_on_every_node_with_requests_limits_and_a_probe(monkeypatch):
    _ns, ds = _daemonset()
    spec = ds["spec"]["template"]["spec"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    # every taint tolerated: no key and no effect, operator Exists
    assert {"operator": "Exists"} in spec["tolerations"]
    assert set(spec.get("nodeSelector", {})) <= {"kubernetes.io/os"} and "affinity" not in spec
    c = _node_container(ds)
    res = c["resources"]
    for kind in ("cpu", "memory"):
        assert 0 < _quantity(res["requests"][kind]) <= _quantity(res["limits"][kind]), kind
    # reaper node's own resident memory here is under 40 MiB: the limit leaves room
    assert _quantity(res["limits"]["memory"]) >= 96 * 2 ** 20
    cfg, _argv = _node_config(ds, monkeypatch)
    assert _ports(c) == {"reaper-metrics": cfg.metrics_port}
    probe = c["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz" and probe["port"] == "reaper-metrics"
    assert c["livenessProbe"]["timeoutSeconds"] < c["livenessProbe"]["periodSeconds"]
    assert spec["terminationGracePeriodSeconds"] >= 2


def test_reaper_node_asks_for_the_least_privilege_that_works():
    """Every capability dropped but PERFMON (sampling a core) and SYSLOG (kallsyms'
    addresses); uid 0 only because Kubernetes makes added capabilities effective for root
    alone; not privileged, no escalation, a read-only root; the comment says what each
    privilege is for."""
    ns, ds = _daemonset()
    spec = ds["spec"]["template"]["spec"]
    assert ds["metadata"]["namespace"] == ns["metadata"]["name"]
    # hostPID, hostNetwork and hostPath are outside Pod Security's baseline: its namespace says so
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    pod = spec["securityContext"]
    assert pod["seccompProfile"]["type"] == "RuntimeDefault"
    assert spec["automountServiceAccountToken"] is False
    sc = _node_container(ds)["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and not sc.get("privileged")
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["PERFMON", "SYSLOG"]}
    head = (K8S / "reaper-node.yaml").read_text().split("\napiVersion:", 1)[0]
    for needed in ("hostPID", "hostNetwork", "PERFMON", "SYSLOG", "read-only", "kmsg", "privileged", "SYS_PTRACE",
                   "root only"):
        assert needed in head, needed


def test_reaper_node_podmonitor_scrapes_the_daemonset_by_node():
    ns, ds = _daemonset()
    (m,) = _docs("reaper-node-podmonitor.yaml")
    assert m["kind"] == "PodMonitor" and m["metadata"]["labels"]["release"] == "prometheus"
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert m["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert ns["metadata"]["name"] in m["spec"]["namespaceSelector"]["matchNames"]
    assert m["spec"]["jobLabel"] in labels
    (e,) = m["spec"]["podMetricsEndpoints"]
    assert e["port"] in _ports(_node_container(ds))
    # node and instance are the node's name: one series per node whatever its pod
    # (docs/alerts.yml's reaper-node rules fire once per node)
    by_target = {r["targetLabel"]: r for r in e["relabelings"]}
    for target in ("node", "instance"):
        assert by_target[target]["sourceLabels"] == ["__meta_kubernetes_pod_node_name"], target
        assert by_target[target].get("action", "replace") == "replace"


@pytest.mark.xdist_group("cpu-heavy")     # one core must be saturated by the test alone
def test_the_daemonsets_command_names_a_culprit_and_its_function_with_only_its_capabilities(tmp_path, monkeypatch):
    """The container's command, as the pod's user with every capability dropped but the
    manifest's and no new privileges (setpriv), the host's /proc and /sys standing for
    this PID namespace's: its probe answers, it names a process burning a core in the
    kernel with its pid and the kernel function it is in (so PERFMON and SYSLOG are
    enough to sample and to name), says nothing of a failure, and it ends at SIGTERM with
    0 within the grace period."""
    import os
    import shutil
    import signal
    import subprocess

    from conftest import REAPER, check_user_can_run, free_port, wait_for
    from metrics_helpers import get, wait_scrape

    _ns, ds = _daemonset()
    spec = ds["spec"]["template"]["spec"]
    c = _node_container(ds)
    uid, gid = spec["securityContext"]["runAsUser"], spec["securityContext"]["runAsGroup"]
    check_user_can_run(uid)
    where = {m["mountPath"]: host for host, m in _host_mounts(ds).items()}
    argv = [where.get(a, a) for a in c["command"][2:]]
    port = free_port()
    argv[argv.index("--metrics-port") + 1] = str(port)
    probe = c["livenessProbe"]["httpGet"]
    caps = c["securityContext"]["capabilities"]["add"]
    keep = ",".join(["-all"] + [f"+{cap.lower()}" for cap in caps])
    node = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", f"--inh-caps={keep}",
                             f"--bounding-set={keep}", "--no-new-privs", REAPER, "node", *argv,
                             "--metrics-address", "127.0.0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    burner = tmp_path / f"kburn{os.urandom(3).hex()}"
    shutil.copy("/bin/dd", burner)
    dd = None
    try:
        def healthy():
            try:
                return get(port, probe["path"], timeout=2)[0] == 200
            except OSError:
                return False
        wait_for(healthy, 20, 0.05, what=f"{probe['path']} on the manifest's port")
        status = dict(line.split(":\t", 1) for line in open(f"/proc/{node.pid}/status").read().splitlines()
                      if ":\t" in line)
        assert status["Uid"].split()[:2] == [str(uid)] * 2
        number = {"PERFMON": 38, "SYSLOG": 34}
        wanted = sum(1 << number[cap] for cap in caps)
        assert int(status["CapEff"], 16) == wanted and int(status["CapBnd"], 16) == wanted
        assert status["NoNewPrivs"] == "1"
        cpu = max(os.sched_getaffinity(0))
        dd = subprocess.Popen([str(burner), "if=/dev/zero", "of=/dev/null", "bs=1M"], stderr=subprocess.DEVNULL,
                              preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))

        def named(s):
            return [x for x in s.samples("reaper_node_kernel_time_top_ratio")
                    if x.labels["pid"] == str(dd.pid) and x.labels["comm"] == burner.name
                    and x.labels["cpu"] == str(cpu)] and \
                [x for x in s.samples("reaper_node_kernel_function_top_ratio") if x.labels["cpu"] == str(cpu)]
        s = wait_scrape(port, named, f"{burner.name} (pid {dd.pid}) and its function named with {caps} only",
                        timeout=30)
        assert s.value("reaper_node_source_available", source="kernel_functions") == 1
        dd.kill()
        dd.wait(30)
        node.send_signal(signal.SIGTERM)
        _out, err = node.communicate(timeout=spec["terminationGracePeriodSeconds"])
        assert node.returncode == 0, err
        assert "Traceback" not in err and "not sampled" not in err, err
    finally:
        for p in (dd, node):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(30)



def test_the_ulimit_follows_kuberays_variable():
    """KubeRay's own command sets `ulimit -n ${RAY_START_ULIMIT_OPEN_FILES:-65536}`: the
    manifest's wrapper does the same, run for real (the generated command prints it)."""
    import subprocess

    (cluster,) = _docs("raycluster.yaml")
    for t in [t for ts in _templates(cluster).values() for t in ts]:
        script = _ray_container(t)["command"][-1]
        base = {"PATH": "/usr/bin:/bin", "KUBERAY_GEN_RAY_START_CMD": "ulimit -n"}
        got = subprocess.run(["bash", "-c", script], env={**base, "RAY_START_ULIMIT_OPEN_FILES": "2000"},
                             capture_output=True, text=True, timeout=30)
        assert (got.stdout, got.stderr) == ("2000\n", "")
        got = subprocess.run(["bash", "-c", script], env=base, capture_output=True, text=True, timeout=30)
        assert got.stderr == "" and int(got.stdout) in (65536, _hard_nofile())


def _hard_nofile() -> int:
    import resource

    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]
