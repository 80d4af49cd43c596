"""The deployment files in deploy/ are valid for the tools that consume them.

promtool checks the scrape fragment (inside a full prometheus.yml), the rules
and their unit tests; a real Prometheus scrapes a real agent through the
fragment's bearer-token job and evaluates the rules; the Grafana dashboard only
the systemd unit
passes ``systemd-analyze verify``; the Kubernetes manifests validate against the
Kubernetes API schemas (kubernetes-validate), the Operator's objects against the
fields of their CRDs they use, the PrometheusRule's groups pass promtool, the
generated objects equal their sources, their cross-references (selectors, ports,
Secret, job label) hold; the Dockerfile copies only what exists, and its probe
passes /healthz with the token on a real agent.

YAML is read with PyYAML (a test dependency).
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from e2e_helpers import (
    RULES,
    binary,
    exporter_metric_names,
    free_port,
    load_yaml,
    promql_metric_names,
    recorded_names,
    rule_groups,
    serve_metric_names,
    wait_http,
)

from kernelfleet.fleet.prometheus_backend import PrometheusBackend, http_json

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROM = DEPLOY / "prometheus"
SCRAPE = PROM / "scrape.yml"
RULES_TEST = PROM / "rules.test.yml"
UNIT = DEPLOY / "systemd" / "kernelfleet-agent.service"
DASHBOARD = DEPLOY / "grafana" / "kernelfleet.json"
SERVE_DASHBOARD = DEPLOY / "grafana" / "kernelfleet-serve.json"
KUBE = DEPLOY / "kubernetes"
DOCKERFILE = ROOT / "Dockerfile"
IMAGE_PLACEHOLDER = "ghcr.io/kernelfleet/kernelfleet:0.1.0"


def test_promql_name_extraction():
    assert promql_metric_names(
        'sum by (job) (rate(a_total{x=~"$h", y="b c"}[5m])) / on(uuid) group_left(hostname) '
        'b_info > 0.2 and c:rec:avg offset 1h or vector(0) * 1e15 - time()'
    ) == {"a_total", "b_info", "c:rec:avg"}


def test_rules_select_only_exported_recorded_or_prometheus_series():
    # up: Prometheus's own, per target
    known = exporter_metric_names() | serve_metric_names() | recorded_names() | {"up"}
    for group in rule_groups():
        for rule in group["rules"]:
            used = promql_metric_names(rule["expr"])
            assert used, rule
            name = rule.get("record") or rule.get("alert")
            assert used <= known, f"{name} uses unknown series {used - known}"


# --------------------------------------------------------------------------
# Prometheus: scrape fragment, rules, rule unit tests.
# --------------------------------------------------------------------------

def _run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=False, capture_output=True, text=True, timeout=120, **kwargs)


def _promtool_has_kubernetes_sd(promtool: str, tmp_path: Path) -> bool:
    probe = tmp_path / "probe.yml"
    probe.write_text("scrape_configs:\n  - job_name: p\n    kubernetes_sd_configs:\n      - role: pod\n")
    done = _run([promtool, "check", "config", str(probe)])
    if done.returncode == 0:
        return True
    assert "kubernetes_sd_configs not found" in done.stdout + done.stderr, done.stdout + done.stderr
    return False


def _replace_kubernetes_sd(fragment: str) -> tuple[str, str]:
    """Swap each ``kubernetes_sd_configs:`` block for an equivalent static target;
    return the new text and the removed blocks."""
    out, removed, skip_deeper_than = [], [], None
    for line in fragment.splitlines():
        indent = len(line) - len(line.lstrip())
        if skip_deeper_than is not None:
            if not line.strip() or indent > skip_deeper_than:
                removed.append(line)
                continue
            skip_deeper_than = None
        if line.strip() == "kubernetes_sd_configs:":
            skip_deeper_than = indent
            removed.append(line)
            out += [" " * indent + "static_configs:", " " * indent + "  - targets: ['127.0.0.1:9400']"]
            continue
        out.append(line)
    return "\n".join(out) + "\n", "\n".join(removed) + "\n"


def full_prometheus_config(tmp_path: Path, fragment: str, rules: Path = RULES, interval: str = "15s") -> Path:
    """prometheus.yml = global settings + rule_files + the fragment, its token files made real."""
    token = tmp_path / "token"
    token.write_text("kernelfleet-test-token\n")
    fragment, count = re.subn(r"(credentials_file:\s*)\S+", lambda m: m.group(1) + str(token), fragment)
    assert count, "scrape.yml sends no bearer token"
    config = tmp_path / "prometheus.yml"
    config.write_text(
        f"global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n"
        f"rule_files:\n  - {rules}\n\n" + fragment
    )
    return config


def test_scrape_fragment_shape():
    (doc,) = load_yaml(SCRAPE)
    jobs = doc["scrape_configs"]
    assert {j["job_name"] for j in jobs} == {"kernelfleet", "kernelfleet-kubernetes", "kernelfleet-serve"}
    for job in jobs:
        assert job["scrape_interval"] == "15s"
        assert job["authorization"]["type"] == "Bearer" and job["authorization"]["credentials_file"]
    # the agents' static job and the model servers' (KernelfleetServeDown watches the latter's name)
    assert [j["job_name"] for j in jobs if "static_configs" in j] == ["kernelfleet", "kernelfleet-serve"]
    (kube,) = [j for j in jobs if "kubernetes_sd_configs" in j]
    assert kube["kubernetes_sd_configs"][0]["role"] == "pod"
    # Its targets end up with job="kernelfleet" too, so KernelfleetAgentDown covers them.
    assert {"target_label": "job", "replacement": "kernelfleet"} in kube["relabel_configs"]


def test_promtool_check_config_with_fragment_and_rules(tmp_path):
    promtool = binary("promtool")
    fragment = SCRAPE.read_text()
    if not _promtool_has_kubernetes_sd(promtool, tmp_path):
        # Debian's promtool is built without Kubernetes discovery: everything
        # but the `kubernetes_sd_configs` block itself is still checked.
        fragment, removed = _replace_kubernetes_sd(fragment)
        block = yaml.safe_load(removed)
        block = block[0] if isinstance(block, list) else block
        assert block["kubernetes_sd_configs"][0]["role"] == "pod"
        warnings.warn("promtool lacks Kubernetes service discovery; the kubernetes_sd_configs block of "
                      "deploy/prometheus/scrape.yml was only parsed, not checked by promtool", stacklevel=1)
    config = full_prometheus_config(tmp_path, fragment)
    done = _run([promtool, "check", "config", str(config)])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout and "rules found" in done.stdout, done.stdout


def test_promtool_check_rules():
    done = _run([binary("promtool"), "check", "rules", str(RULES)])
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in rule_groups())} rules found" in done.stdout


def test_promtool_rule_unit_tests_pass():
    done = _run([binary("promtool"), "test", "rules", RULES_TEST.name], cwd=PROM)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_rule_unit_tests_cover_every_alert_firing():
    (doc,) = load_yaml(RULES_TEST)
    alerts = {r["alert"] for g in rule_groups() for r in g["rules"] if "alert" in r}
    assert alerts == {"KernelfleetOfuRegression", "KernelfleetGpuStale", "KernelfleetAgentDown",
                      "KernelfleetGpuIdleHeld", "KernelfleetServeDown", "KernelfleetServeSlowTokens",
                      "KernelfleetServeRejecting"}
    fired = {t["alertname"] for test in doc["tests"] for t in test.get("alert_rule_test", [])
             if t["exp_alerts"]}
    assert fired == alerts
    for group in rule_groups():
        for rule in group["rules"]:
            if "alert" in rule:
                assert rule["labels"]["severity"]
                assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def _agent_with_token(tmp_path: Path, token: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernelfleet", "agent", "--demo", "--speed", "4",
         "--store", str(tmp_path / "kf.db"), "--listen", f"127.0.0.1:{port}"],
        env={**os.environ, "KERNELFLEET_TOKEN": token},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    return proc, port


def test_prometheus_scrapes_an_agent_with_the_fragment_token_and_evaluates_the_rules(tmp_path):
    """The fragment's static job, token included, against a real agent that requires it."""
    prometheus = binary("prometheus")
    fragment = SCRAPE.read_text()
    static = fragment[: fragment.index("  - job_name: kernelfleet-kubernetes")]  # the static job only
    static = re.sub(r"(- targets:[^\n]*\n)(\s+- [^\n]+\n)+", r"\1          - 127.0.0.1:AGENT_PORT\n", static)
    static = static.replace("scrape_interval: 15s", "scrape_interval: 1s")
    static = static.replace("scrape_timeout: 10s", "scrape_timeout: 1s")
    config = full_prometheus_config(tmp_path, static, interval="1s")
    token = (tmp_path / "token").read_text().strip()
    agent, agent_port = _agent_with_token(tmp_path, token)
    config.write_text(config.read_text().replace("AGENT_PORT", str(agent_port)))
    port = free_port()
    prom = None
    try:
        deadline = time.monotonic() + 30
        while True:  # the agent is up when it refuses us without the token
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{agent_port}/metrics", timeout=2)
                pytest.fail("the agent served /metrics without its bearer token")
            except urllib.error.HTTPError as exc:
                assert exc.code == 401
                break
            except OSError:
                if agent.poll() is not None:
                    pytest.fail(f"the agent exited: {agent.stderr.read() if agent.stderr else ''}")
                assert time.monotonic() < deadline, "the agent did not start listening"
                time.sleep(0.2)
        log = tmp_path / "prometheus.log"
        with log.open("w") as log_file:
            prom = subprocess.Popen(
                [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}"],
                stdout=subprocess.DEVNULL, stderr=log_file,
            )
        try:
            wait_http(f"http://127.0.0.1:{port}/-/ready", timeout=60)
        except OSError:
            pytest.fail(f"Prometheus did not start:\n{config.read_text()}\n{log.read_text()[-3000:]}")

        def query(q: str) -> list:
            url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
            return json.loads(urllib.request.urlopen(url, timeout=5).read())["data"]["result"]

        wanted = ['up{job="kernelfleet"} == 1', "kernelfleet:fleet_ofu:avg",
                  "kernelfleet:gpu_achieved_bf16_flops", "kernelfleet:fleet_ofu:capacity_weighted",
                  "kernelfleet:job_ofu:avg", "kernelfleet:job_achieved_bf16_flops:sum",
                  "kernelfleet:fleet_gpu_ofu:avg", "kernelfleet:fleet_gpus_with_ofu:count", "kernelfleet:job_gpus:count"]
        deadline = time.monotonic() + 60
        while not all(query(q) for q in wanted) and time.monotonic() < deadline:
            time.sleep(1)
        for q in wanted:
            assert query(q), f"Prometheus never had {q}"
        (achieved,) = query("kernelfleet:gpu_achieved_bf16_flops")
        assert achieved["metric"]["job"] == "kernelfleet" and achieved["metric"]["model"] == "h200-sxm"
        # The recording's process is a job: the per-job rules group by the label the exporter really uses.
        (info,) = query("kernelfleet_job_info")
        (job,) = query("kernelfleet:job_ofu:avg")
        assert set(job["metric"]) == {"__name__", "job_id"}
        assert job["metric"]["job_id"] == info["metric"]["job_id"]
        assert 0.0 <= float(job["value"][1]) <= 1.1
        # The fleet dashboard's backend reads the recorded series, not every GPU's
        asked: list[str] = []

        def fetch(url: str):
            asked.append(urllib.parse.parse_qs(urllib.parse.urlsplit(url).query).get("query", [""])[0])
            return http_json(url)

        backend = PrometheusBackend(f"http://127.0.0.1:{port}", fetch=fetch)
        now = time.time()
        points = backend.fleet_series(now - 120, now)
        assert points and all(p["gpus"] == 1 and 0.0 <= p["ofu"] <= 1.1 for p in points)
        assert asked == ["avg_over_time(kernelfleet:fleet_gpu_ofu:avg[60s])", "kernelfleet:fleet_gpus_with_ofu:count"]
        (summary,) = backend.job_summaries(now - 900)
        assert summary["job"] == info["metric"]["job_id"] and summary["gpus"] == 1
        assert backend.job(summary["job"])["timeline_1m"]
        assert "kernelfleet:job_gpus:count" in asked and not any("count by (job_id)" in q for q in asked)
    finally:
        if prom is not None:
            prom.send_signal(signal.SIGTERM)
            prom.wait(timeout=30)
        agent.kill()
        agent.wait(timeout=10)


# --------------------------------------------------------------------------
# systemd
# --------------------------------------------------------------------------

def test_systemd_unit(tmp_path):
    text = UNIT.read_text()
    unit = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",),
                                     comment_prefixes=("#", ";"))
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read_string(text)
    service = unit["Service"]
    exec_start = service["ExecStart"].split()
    assert exec_start[1] == "agent"
    assert exec_start[exec_start.index("--listen") + 1].startswith("127.0.0.1:"), "loopback by default"
    assert "--allow-remote" not in exec_start
    store = exec_start[exec_start.index("--store") + 1]
    assert service.get("DynamicUser") == "yes" or service.get("User")
    assert service["StateDirectory"] and store.startswith(f"/var/lib/{service['StateDirectory']}/")
    assert service["Restart"] == "on-failure"
    assert service["ProtectSystem"] == "strict"
    assert service["NoNewPrivileges"] == "yes"
    assert service.get("PrivateDevices", "no") == "no", "NVML needs /dev/nvidia*"
    assert service.get("ProtectProc", "default") == "default", "attribution reads other users' /proc/<pid>"
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    # The commented remote example: a token from an EnvironmentFile, --allow-remote.
    assert re.search(r"^#\s*EnvironmentFile=\S+", text, re.MULTILINE) and re.search(r"^#.*--allow-remote", text, re.MULTILINE)
    assert "KERNELFLEET_TOKEN" in text

    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        warnings.warn("systemd-analyze is not installed: the unit was checked with configparser only",
                      stacklevel=1)
        return
    # verify wants ExecStart's binary to exist: point it at this checkout's entry point.
    entry = Path(sys.executable).with_name("kernelfleet")
    copy = tmp_path / UNIT.name
    copy.write_text(text.replace(exec_start[0], str(entry if entry.exists() else sys.executable)))
    done = _run([analyze, "verify", str(copy)])
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    # Unknown keys and bad values are only warnings: none may name this unit.
    assert UNIT.name not in output, output


# --------------------------------------------------------------------------
# Kubernetes
# --------------------------------------------------------------------------

def kube_objects() -> dict[str, dict]:
    """Every object of deploy/kubernetes by kind (kustomization.yaml is kustomize's, not an object)."""
    objects: dict[str, dict] = {}
    for path in sorted(KUBE.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in load_yaml(path):
            assert doc["kind"] not in objects, f"{path.name}: a second {doc['kind']}"
            objects[doc["kind"]] = doc
    return objects


OPERATOR_KINDS = ("ServiceMonitor", "PrometheusRule")


def test_kubernetes_objects_validate_against_the_api_schemas():
    objects = kube_objects()
    assert set(objects) == {"Namespace", "ServiceAccount", "DaemonSet", "Service", "ConfigMap", *OPERATOR_KINDS}
    version = kubernetes_validate.latest_version()
    for kind, doc in objects.items():
        if kind not in OPERATOR_KINDS:
            kubernetes_validate.validate(doc, version, strict=True)
    # Strict means a misspelt field fails (the API server would drop it, probe and all).
    planted = json.loads(json.dumps(objects["DaemonSet"]))
    container = planted["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(planted, version, strict=True)


# kubernetes-validate knows only the built-in kinds. What the Prometheus Operator's CRDs
# (monitoring.coreos.com/v1) define of the fields we use, with nothing else allowed: a misspelt
# field fails here, where the API server's structural schema would prune it without a word.
def _obj(properties: dict, required: tuple[str, ...] = ()) -> dict:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


_STR, _DURATION = {"type": "string"}, {"type": "string", "pattern": r"^(\d+(ms|s|m|h|d|w|y))+$"}
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_META = _obj({"name": _STR, "namespace": _STR, "labels": _LABELS}, ("name",))
_RELABEL = _obj({"sourceLabels": {"type": "array", "items": _STR}, "targetLabel": _STR, "regex": _STR,
                 "replacement": _STR, "separator": _STR,
                 "action": {"enum": ["replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep",
                                     "lowercase", "uppercase", "keepequal", "dropequal"]}})
CRD_FIELDS = {
    "ServiceMonitor": _obj({
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "ServiceMonitor"}, "metadata": _META,
        "spec": _obj({
            "jobLabel": _STR, "selector": _obj({"matchLabels": _LABELS}),
            "namespaceSelector": _obj({"matchNames": {"type": "array", "items": _STR}, "any": {"type": "boolean"}}),
            "endpoints": {"type": "array", "minItems": 1, "items": _obj({
                "port": _STR, "path": _STR, "interval": _DURATION, "scrapeTimeout": _DURATION,
                "honorLabels": {"type": "boolean"},
                "authorization": _obj({"type": _STR, "credentials": _obj({"name": _STR, "key": _STR}, ("name", "key"))}),
                "relabelings": {"type": "array", "items": _RELABEL}}, ("port",))},
        }, ("selector", "endpoints"))}, ("apiVersion", "kind", "metadata", "spec")),
    "PrometheusRule": _obj({
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "PrometheusRule"}, "metadata": _META,
        "spec": _obj({"groups": {"type": "array", "minItems": 1, "items": _obj({
            "name": _STR, "interval": _DURATION, "rules": {"type": "array", "minItems": 1, "items": _obj({
                "record": _STR, "alert": _STR, "expr": _STR, "for": _DURATION, "keep_firing_for": _DURATION,
                "labels": _LABELS, "annotations": _LABELS}, ("expr",))}}, ("name", "rules"))}}, ("groups",)),
    }, ("apiVersion", "kind", "metadata", "spec")),
}


def test_operator_objects_use_only_fields_their_crds_define():
    objects = kube_objects()
    for kind in OPERATOR_KINDS:
        jsonschema.validate(objects[kind], CRD_FIELDS[kind])
    planted = json.loads(json.dumps(objects["ServiceMonitor"]))
    planted["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(planted, CRD_FIELDS["ServiceMonitor"])


def test_prometheusrule_is_rules_yml_and_its_groups_pass_promtool(tmp_path):
    rule = kube_objects()["PrometheusRule"]
    (rules_doc,) = load_yaml(RULES)
    assert rule["spec"] == rules_doc
    extracted = tmp_path / "prometheusrule-groups.yml"
    extracted.write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    done = _run([binary("promtool"), "check", "rules", str(extracted)])
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in rule['spec']['groups'])} rules found" in done.stdout


def test_grafana_configmap_is_the_dashboards_byte_for_byte():
    configmap = kube_objects()["ConfigMap"]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["data"] == {"kernelfleet.json": DASHBOARD.read_text(),
                                 "kernelfleet-serve.json": SERVE_DASHBOARD.read_text()}


def test_generated_objects_are_current_and_a_stale_one_is_named(tmp_path):
    generate = [sys.executable, str(KUBE / "generate.py")]
    done = _run([*generate, "--check"])
    assert done.returncode == 0, done.stdout + done.stderr
    # The same check on a folder where one of them is stale: exit 1, one line naming it.
    for name in ("prometheusrule.yaml", "grafana-dashboard.yaml"):
        shutil.copy(KUBE / name, tmp_path / name)
    (tmp_path / "prometheusrule.yaml").write_text((KUBE / "prometheusrule.yaml").read_text() + "# edited by hand\n")
    done = _run([*generate, "--check", "--out", str(tmp_path)])
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"{tmp_path}: prometheusrule.yaml differ from their sources: run make k8s-manifests"]


def test_kustomization_lists_every_manifest_and_builds():
    (kustomization,) = load_yaml(KUBE / "kustomization.yaml")
    files = {p.name for p in KUBE.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(files)
    assert kustomization["namespace"] == "kernelfleet"
    (image,) = kustomization["images"]
    assert f"{image['name']}:{image['newTag']}" == IMAGE_PLACEHOLDER
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        warnings.warn("kubectl is not installed: `kubectl kustomize deploy/kubernetes` was not run", stacklevel=1)
        return
    done = _run([kubectl, "kustomize", str(KUBE)])
    assert done.returncode == 0, done.stderr
    built = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert sorted(d["kind"] for d in built) == sorted(kube_objects())
    version = kubernetes_validate.latest_version()
    for doc in built:
        assert doc["kind"] == "Namespace" or doc["metadata"]["namespace"] == "kernelfleet"
        if doc["kind"] not in OPERATOR_KINDS:
            kubernetes_validate.validate(doc, version, strict=True)


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def test_daemonset_names_pods_without_privilege():
    objects = kube_objects()
    ds, account = objects["DaemonSet"], objects["ServiceAccount"]
    pod = ds["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    security = agent["securityContext"]
    # No ptrace, no privileged container, no host PID namespace, no API access.
    assert not pod.get("hostPID") and not security.get("privileged")
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["allowPrivilegeEscalation"] is False and security["readOnlyRootFilesystem"] is True
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is False and account["automountServiceAccountToken"] is False
    assert not {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"} & objects.keys()
    # The kubelet's pod-resources socket, read-only, and the flag pointing into it.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    kubelet = mounts["/var/lib/kubelet/pod-resources"]
    assert kubelet["readOnly"] is True
    assert volumes[kubelet["name"]]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    args = agent["args"]
    socket_path = Path(args[args.index("--pod-resources-socket") + 1])
    assert str(socket_path.parent) == kubelet["mountPath"]
    # GPUs through the NVIDIA runtime, none requested.
    env = _env(agent)
    assert pod.get("runtimeClassName") == "nvidia" and env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert "nvidia.com/gpu" not in agent["resources"].get("limits", {}), "the agent must not take a GPU"
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= agent["resources"][kind].keys()
    assert any("nvidia.com/gpu" in k for k in pod["nodeSelector"])
    assert any(t.get("key") == "nvidia.com/gpu" for t in pod["tolerations"])
    # The store lives on a volume.
    store = Path(args[args.index("--store") + 1])
    store_volume = volumes[mounts[str(store.parent)]["name"]]
    assert "emptyDir" in store_volume or "hostPath" in store_volume
    # The placeholder image is marked as one, on its own line.
    assert agent["image"] == IMAGE_PLACEHOLDER
    (line,) = [ln for ln in (KUBE / "daemonset.yaml").read_text().splitlines() if IMAGE_PLACEHOLDER in ln]
    assert "PLACEHOLDER" in line


def test_daemonset_probes_healthz_with_the_token_on_its_listen_address():
    objects = kube_objects()
    ds = objects["DaemonSet"]
    (agent,) = ds["spec"]["template"]["spec"]["containers"]
    env, args = _env(agent), agent["args"]
    assert args[0] == "agent" and "--allow-remote" in args
    (port,) = [p for p in agent["ports"] if p["name"] == "metrics"]
    names = [e["name"] for e in agent["env"]]
    # --listen and the probe both read KERNELFLEET_LISTEN, made from HOST_IP (defined before it).
    assert args[args.index("--listen") + 1] == "$(KERNELFLEET_LISTEN)"
    assert env["KERNELFLEET_LISTEN"]["value"] == f"$(HOST_IP):{port['containerPort']}"
    assert names.index("HOST_IP") < names.index("KERNELFLEET_LISTEN")
    assert env["HOST_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    secret = env["KERNELFLEET_TOKEN"]["valueFrom"]["secretKeyRef"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert agent[probe]["exec"]["command"] == ["python", "-m", "kernelfleet.fleet.probe"], probe
        assert agent[probe]["timeoutSeconds"] > 3  # the probe's own timeout (kernelfleet/fleet/probe.py)
    assert (ROOT / "kernelfleet" / "fleet" / "probe.py").exists()

    # Service and ServiceMonitor find the agents and their port, with the same token and job label.
    svc, monitor = objects["Service"], objects["ServiceMonitor"]
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    (svc_port,) = svc["spec"]["ports"]
    assert svc_port["targetPort"] in (port["name"], port["containerPort"])
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert svc["metadata"]["namespace"] in monitor["spec"]["namespaceSelector"]["matchNames"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == svc_port["name"] and endpoint["interval"] == "15s"
    assert endpoint["authorization"]["credentials"] == {"name": secret["name"], "key": secret["key"]}
    assert svc["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "kernelfleet"
    (down,) = [r for g in rule_groups() for r in g["rules"] if r.get("alert") == "KernelfleetAgentDown"]
    assert 'job="kernelfleet"' in down["expr"]
    # The Operator's own namespace/pod/container target labels would rename the workload's.
    (drop,) = [r for r in endpoint["relabelings"] if r.get("action") == "labeldrop"]
    assert all(re.fullmatch(drop["regex"], label) for label in ("namespace", "pod", "container"))
    assert not re.fullmatch(drop["regex"], "node")


# --------------------------------------------------------------------------
# Dockerfile and its health probe
# --------------------------------------------------------------------------

def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: continuation lines joined, comments dropped."""
    out, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        instruction, _, arguments = (pending + line).strip().partition(" ")
        out.append((instruction.upper(), arguments.strip()))
        pending = ""
    return out


def dockerfile_problems(text: str, context: Path, ignore: str) -> list[str]:
    """What is wrong with a Dockerfile for the agent's image: one line each."""
    problems = []
    steps = dockerfile_instructions(text)
    kinds = [k for k, _ in steps]
    known = {"FROM", "WORKDIR", "COPY", "RUN", "ENV", "USER", "VOLUME", "EXPOSE", "HEALTHCHECK", "ENTRYPOINT", "CMD",
             "ARG", "LABEL"}
    problems += [f"unknown instruction {k}" for k in kinds if k not in known]
    if not kinds or kinds[0] not in ("FROM", "ARG"):
        problems.append("does not start with FROM")
    reincluded = {line[1:].rstrip("/") for line in ignore.splitlines() if line.startswith("!")}
    for kind, arguments in steps:
        if kind == "COPY" and not arguments.startswith("--from="):
            *sources, _ = arguments.split()
            for source in sources:
                if not (context / source).exists():
                    problems.append(f"COPY {source}: no such file in the build context")
                elif source.rstrip("/") not in reincluded:
                    problems.append(f"COPY {source}: excluded by .dockerignore")
        if kind == "RUN" and "pip install" in arguments and "[" in arguments.split("pip install", 1)[1]:
            problems.append(f"RUN {arguments[:60]}: installs an extra (the image is the see half only)")
    users = [a for k, a in steps if k == "USER"]
    if not users or users[-1].split(":")[0] in ("0", "root"):
        problems.append("runs as root (no USER, or USER 0)")
    return problems


def test_dockerfile_copies_only_what_exists_and_probes_healthz():
    text = DOCKERFILE.read_text()
    ignore = (ROOT / ".dockerignore").read_text()
    assert dockerfile_problems(text, ROOT, ignore) == []
    steps = dict(dockerfile_instructions(text))  # the last of each kind
    assert steps["EXPOSE"] == "9400"
    assert json.loads(steps["ENTRYPOINT"]) == ["kernelfleet"]
    assert 'kernelfleet = "kernelfleet.cli:main"' in (ROOT / "pyproject.toml").read_text()
    assert json.loads(steps["HEALTHCHECK"].split("CMD", 1)[1]) == ["python", "-m", "kernelfleet.fleet.probe"]
    command = json.loads(steps["CMD"])
    assert command[0] == "agent" and command[command.index("--listen") + 1].endswith(":9400")
    # The checker finds what it is for.
    planted = text.replace("COPY kernelfleet ./kernelfleet", "COPY kernelfleet tests ./") + "USER root\n"
    assert dockerfile_problems(planted, ROOT, ignore) == [
        "COPY tests: excluded by .dockerignore", "runs as root (no USER, or USER 0)"]
    assert "COPY nope: no such file in the build context" in dockerfile_problems(
        text.replace("COPY pyproject.toml", "COPY nope pyproject.toml"), ROOT, ignore)

    docker = shutil.which("docker") or shutil.which("podman")
    if docker is None or _run([docker, "info"]).returncode != 0:
        warnings.warn("no Docker or Podman daemon here: the Dockerfile was checked, not built", stacklevel=1)
        return
    done = subprocess.run([docker, "build", "-q", "-t", "kernelfleet-test:ci", str(ROOT)], check=False,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]


def test_probe_passes_on_a_healthy_agent_and_fails_in_one_line(tmp_path):
    from kernelfleet.fleet.probe import check

    agent, port = _agent_with_token(tmp_path, "probe-token")
    probe = [sys.executable, "-m", "kernelfleet.fleet.probe"]
    try:
        deadline = time.monotonic() + 30
        while check(f"127.0.0.1:{port}", "probe-token") is not None:
            assert agent.poll() is None, agent.stderr.read() if agent.stderr else ""
            assert time.monotonic() < deadline, check(f"127.0.0.1:{port}", "probe-token")
            time.sleep(0.2)
        env = {**os.environ, "KERNELFLEET_TOKEN": "probe-token", "KERNELFLEET_LISTEN": f"127.0.0.1:{port}"}
        assert _run(probe, env=env).returncode == 0
        wrong = _run(probe, env={**env, "KERNELFLEET_TOKEN": "wrong"})
        assert wrong.returncode == 1 and wrong.stderr.strip().splitlines() == [
            (f"kernelfleet probe: 127.0.0.1:{port}: 401, the token is missing or wrong (set KERNELFLEET_TOKEN as for "
             "the agent)")]
    finally:
        agent.kill()
        agent.wait(timeout=10)
    gone = _run([*probe, f"127.0.0.1:{port}"], env=env)
    assert gone.returncode == 1 and len(gone.stderr.strip().splitlines()) == 1
    assert gone.stderr.startswith(f"kernelfleet probe: 127.0.0.1:{port}: no answer")


def test_the_pod_owners_component_grants_get_on_pods_only_and_turns_the_lookup_on(tmp_path):
    """deploy/kubernetes/pod-owners (agent --pod-owners api): a ClusterRole with `get` on pods and
    nothing else, bound to the agents' ServiceAccount, and the DaemonSet patched to mount its token
    and ask the API server."""
    folder = KUBE / "pod-owners"
    role, binding = load_yaml(folder / "rbac.yaml")
    version = kubernetes_validate.latest_version()
    for doc in (role, binding):
        kubernetes_validate.validate(doc, version, strict=True)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
    account = kube_objects()["ServiceAccount"]["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "kernelfleet"}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        warnings.warn("kubectl is not installed: the pod-owners overlay was not built", stacklevel=1)
        return
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    base = os.path.relpath(KUBE, overlay)  # kustomize takes relative paths only
    (overlay / "kustomization.yaml").write_text(f"resources: [{base}]\ncomponents: [{base}/pod-owners]\n")
    done = _run([kubectl, "kustomize", str(overlay)])
    assert done.returncode == 0, done.stderr
    built = {d["kind"]: d for d in yaml.safe_load_all(done.stdout) if d}
    pod = built["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True
    assert pod["containers"][0]["args"][-2:] == ["--pod-owners", "api"]
    assert {"ClusterRole", "ClusterRoleBinding"} <= set(built)
    for doc in built.values():
        if doc["kind"] not in OPERATOR_KINDS:
            kubernetes_validate.validate(doc, version, strict=True)
