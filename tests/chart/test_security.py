"""Pod security and RBAC of the rendered chart, and RBAC against what the code calls."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from tests.chart.conftest import ROOT, Installed, containers, env_of

ALL_FEATURES = ROOT / ".ci" / "all-features-values.yaml"
# Volume types the "restricted" Pod Security Standard allows.
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
}


@pytest.fixture(params=["default", "all-features"])
def installed(request: pytest.FixtureRequest, install: Callable[..., Installed]) -> Installed:
    result = install(ALL_FEATURES) if request.param == "all-features" else install()
    assert result.ok, result.error
    return result


def restricted_violations(pod_spec: dict[str, Any]) -> list[str]:
    """Pod Security Standard "restricted" (v1.33) checks, by the rule names Kubernetes uses."""
    problems = []
    pod_context = pod_spec.get("securityContext", {})
    for volume in pod_spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            problems.append(f"restricted volume types: {volume['name']} uses {kinds}")
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(field):
            problems.append(f"host namespaces: {field}")
    for container in pod_spec.get("containers", []) + pod_spec.get("initContainers", []):
        context = container.get("securityContext", {})
        name = container["name"]
        if context.get("privileged"):
            problems.append(f"privileged: {name}")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"allowPrivilegeEscalation != false: {name}")
        if "ALL" not in context.get("capabilities", {}).get("drop", []):
            problems.append(f"capabilities: {name} does not drop ALL")
        if set(context.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"capabilities: {name} adds {context['capabilities']['add']}")
        if not (context.get("runAsNonRoot") or pod_context.get("runAsNonRoot")):
            problems.append(f"runAsNonRoot != true: {name}")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            problems.append(f"runAsUser=0: {name}")
        seccomp = context.get("seccompProfile", pod_context.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"seccompProfile: {name} has {seccomp}")
        for port in container.get("ports", []):
            if port.get("hostPort"):
                problems.append(f"host ports: {name}")
    return problems


def test_controller_meets_restricted_pod_security(installed: Installed) -> None:
    spec = installed.one("Deployment", "-controller")["spec"]["template"]["spec"]
    assert restricted_violations(spec) == []
    controller = containers(installed.one("Deployment", "-controller"))["controller"]
    assert controller["securityContext"]["readOnlyRootFilesystem"] is True
    assert controller["resources"]["requests"] and controller["resources"]["limits"]
    assert {"livenessProbe", "readinessProbe", "startupProbe"} <= set(controller)


def test_restricted_check_can_fail() -> None:
    """The checker above finds what it should (so its empty answer means something)."""
    spec = {
        "hostPID": True,
        "volumes": [{"name": "proc", "hostPath": {"path": "/proc"}}],
        "containers": [{"name": "c", "securityContext": {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}}}],
    }
    problems = restricted_violations(spec)
    for rule in ("restricted volume types", "host namespaces", "privileged", "capabilities", "runAsNonRoot", "seccomp"):
        assert any(problem.startswith(rule) for problem in problems), (rule, problems)


def test_agent_is_not_privileged_and_mounts_host_paths_read_only(installed: Installed) -> None:
    daemonset = installed.one("DaemonSet", "-agent")
    spec = daemonset["spec"]["template"]["spec"]
    agent = containers(daemonset)["agent"]
    context = agent["securityContext"]
    assert context["privileged"] is False and context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["readOnlyRootFilesystem"] is True
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert not any(spec.get(field) for field in ("hostNetwork", "hostIPC"))
    assert spec["hostPID"] is True  # agent.hostPID: NVML lists only the processes of its caller's PID namespace
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    assert host_paths.pop("pod-resources") == "/var/lib/kubelet/pod-resources"
    if env_of(agent)["GPUWM_PROC_ROOT"]["value"] == "/host/proc":  # per-process attribution on
        assert host_paths.pop("host-proc") == "/proc"
    assert host_paths == {}, f"unexpected host paths {host_paths}"
    for name in ("pod-resources", "host-proc"):
        if name in mounts:
            assert mounts[name]["readOnly"] is True, name
    assert env_of(agent)["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"


def test_agent_without_host_pid_reads_the_hosts_proc(install: Callable[..., Installed]) -> None:
    """agent.hostPID=false: NVML's per-process utilisation names host PIDs, so the host's /proc is mounted to map them."""
    installed = install(values={"agent": {"hostPID": False}})
    assert installed.ok, installed.error
    daemonset = installed.one("DaemonSet", "-agent")
    spec = daemonset["spec"]["template"]["spec"]
    agent = containers(daemonset)["agent"]
    assert not spec.get("hostPID")
    assert {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}["host-proc"] == "/proc"
    mount = next(m for m in agent["volumeMounts"] if m["name"] == "host-proc")
    assert (mount["mountPath"], mount["readOnly"]) == ("/host/proc", True)
    assert env_of(agent)["GPUWM_PROC_ROOT"]["value"] == "/host/proc"


def test_the_kubelets_folder_on_the_host_and_the_socket_in_the_agent_are_set_apart(
    install: Callable[..., Installed],
) -> None:
    """A kubelet with another root dir (MicroK8s, k0s, a test node): the host folder moves, the agent's path stays."""
    host = "/var/snap/microk8s/common/var/lib/kubelet/pod-resources"
    installed = install(values={"agent": {"podResourcesHostPath": host}})
    assert installed.ok, installed.error
    daemonset = installed.one("DaemonSet", "-agent")
    volume = next(v for v in daemonset["spec"]["template"]["spec"]["volumes"] if v["name"] == "pod-resources")
    mount = next(m for m in containers(daemonset)["agent"]["volumeMounts"] if m["name"] == "pod-resources")
    assert volume["hostPath"] == {"path": host, "type": "Directory"}
    assert (mount["mountPath"], mount["readOnly"]) == ("/var/lib/kubelet/pod-resources", True)
    socket = env_of(containers(daemonset)["agent"])["GPUWM_POD_RESOURCES_SOCKET"]["value"]
    assert socket == "/var/lib/kubelet/pod-resources/kubelet.sock"


def test_agent_runs_on_gpu_nodes_only(installed: Installed) -> None:
    spec = installed.one("DaemonSet", "-agent")["spec"]["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]


def test_no_host_proc_without_per_process_attribution(install: Callable[..., Installed]) -> None:
    installed = install()
    spec = installed.one("DaemonSet")["spec"]["template"]["spec"]
    assert all(v.get("hostPath", {}).get("path") != "/proc" for v in spec["volumes"])
    assert "runtimeClassName" not in spec


def _rules(installed: Installed, suffix: str) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = installed.one("ClusterRole", suffix)["rules"]
    return rules


def test_rbac_has_no_wildcards_and_no_secrets(installed: Installed) -> None:
    for kind in ("ClusterRole", "Role"):
        for role in installed.objects(kind):
            for rule in role["rules"]:
                for key in ("apiGroups", "resources", "verbs"):
                    assert "*" not in rule.get(key, []), f"{role['metadata']['name']}: wildcard in {key}: {rule}"
                if "secrets" in rule.get("resources", []):
                    # only the Secrets the controller keeps the API's certificate and its engine state in, by name;
                    # `create` cannot be limited to a name by RBAC; never list or watch (which would show every
                    # Secret's contents)
                    assert kind == "Role" and role["metadata"]["name"].endswith(("-controller-tls", "-controller")), (
                        f"{kind} {role['metadata']['name']} can touch secrets")
                    assert rule.get("resourceNames") or rule["verbs"] == ["create"], rule
                    assert not {"list", "watch"} & set(rule["verbs"]), rule
                assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule


def test_agent_may_only_read_kubelet_stats(installed: Installed) -> None:
    """nodes/stats is what the kubelet checks for /stats/summary, nodes/metrics for /metrics/cadvisor; nodes/proxy
    would also allow exec into pods."""
    assert _rules(installed, "-agent") == [
        {"apiGroups": [""], "resources": ["nodes/stats", "nodes/metrics"], "verbs": ["get"]}
    ]


def test_service_accounts_are_bound_to_their_roles(installed: Installed) -> None:
    for component in ("controller", "agent"):
        binding = installed.one("ClusterRoleBinding", f"-{component}")
        kind = "Deployment" if component == "controller" else "DaemonSet"
        account = installed.one(kind)["spec"]["template"]["spec"]["serviceAccountName"]
        assert binding["roleRef"]["name"] == installed.one("ClusterRole", f"-{component}")["metadata"]["name"]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "gpuwm"}]
        assert installed.one("ServiceAccount", f"-{component}")["metadata"]["name"] == account


def _granted(rules: Iterable[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(
        group in rule.get("apiGroups", []) and resource in rule.get("resources", []) and verb in rule.get("verbs", [])
        for rule in rules
    )


def missing_grants(required: Iterable[dict[str, Any]], granted: list[dict[str, Any]]) -> list[str]:
    """Each (group, resource, verb) the code needs that no granted rule covers."""
    return [
        f"{verb} {group or 'core'}/{resource}"
        for rule in required
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        if not _granted(granted, group, resource, verb)
    ]


def test_missing_grants_finds_a_missing_verb() -> None:
    granted = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]
    required = [{"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["list", "watch"]}]
    assert missing_grants(required, granted) == ["watch core/pods", "list core/nodes", "watch core/nodes"]


def test_chart_grants_every_verb_the_controller_calls(install: Callable[..., Installed]) -> None:
    """gpuwm.controller.rbac.REQUIRED_RULES lists what the code calls; the chart must grant all of it."""
    if not (ROOT / "operator" / "gpuwm" / "controller" / "rbac.py").exists():
        pytest.skip("operator/gpuwm/controller/rbac.py (REQUIRED_RULES) is not written yet")
    required = importlib.import_module("gpuwm.controller.rbac").REQUIRED_RULES
    installed = install()
    assert installed.ok, installed.error
    missing = missing_grants(required, _rules(installed, "-controller"))
    assert not missing, f"the chart's controller ClusterRole lacks {missing}: add them to templates/controller-rbac.yaml"


def test_controller_rbac_grants_what_the_design_names(install: Callable[..., Installed]) -> None:
    """Independent of the code: the owner kinds, CRs, status, events, peering and reviews (DESIGN §2, §5)."""
    installed = install()
    rules = _rules(installed, "-controller")
    needed = [
        ("", "pods", "watch"), ("", "namespaces", "list"), ("apps", "replicasets", "get"), ("batch", "jobs", "get"),
        ("jobset.x-k8s.io", "jobsets", "get"), ("kubeflow.org", "pytorchjobs", "get"), ("ray.io", "rayjobs", "get"),
        ("leaderworkerset.x-k8s.io", "leaderworkersets", "get"), ("gpuwm.io", "gpuworkloadmetrics", "create"),
        ("gpuwm.io", "gpuworkloadmetrics/status", "patch"), ("gpuwm.io", "gpuprojectmetrics", "delete"),
        ("", "events", "create"), ("events.k8s.io", "events", "create"), ("kopf.dev", "clusterkopfpeerings", "patch"),
        ("authentication.k8s.io", "tokenreviews", "create"), ("authorization.k8s.io", "subjectaccessreviews", "create"),
    ]
    missing = [need for need in needed if not _granted(rules, *need)]
    assert not missing, missing
    assert not _granted(rules, "", "pods", "patch"), "the controller never writes users' pods"


def test_crd_files_in_chart_are_valid_yaml(tmp_path: Path) -> None:
    import yaml

    for path in (ROOT / "charts" / "gpuwm" / "crds").glob("*.yaml"):
        for document in yaml.safe_load_all(path.read_text()):
            assert document["kind"] == "CustomResourceDefinition", path
