"""The chart's security: NetworkPolicies on by default, the agent without nodes/proxy, HTTPS for the API
(by default a CA and certificate the controller keeps in a Secret, a cert-manager Certificate or your own
Secret), and a ServiceMonitor that scrapes
the authorised /metrics over HTTPS with an audience-bound token."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.chart.conftest import CHART, Installed, containers, env_of

VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def test_network_policies_are_on_by_default(install: Callable[..., Installed]) -> None:
    installed = install()
    assert installed.ok, installed.error
    agent = installed.one("NetworkPolicy", "-agent")["spec"]
    assert agent["policyTypes"] == ["Ingress"]
    (rule,) = agent["ingress"]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    # the controller only: no empty `from` (which would mean everyone)
    assert [peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for peer in rule["from"]] == [
        "controller"
    ]
    assert installed.one("NetworkPolicy", "-controller")["spec"]["ingress"][0]["ports"] == [
        {"port": "http", "protocol": "TCP"}
    ]


def test_agent_rbac_has_no_nodes_proxy(install: Callable[..., Installed]) -> None:
    installed = install()
    resources = {r for rule in installed.one("ClusterRole", "-agent")["rules"] for r in rule["resources"]}
    assert resources == {"nodes/stats", "nodes/metrics"}


def test_api_is_https_by_default_with_a_self_signed_certificate(install: Callable[..., Installed]) -> None:
    installed = install()
    assert installed.ok, installed.error
    controller = containers(installed.one("Deployment", "-controller"))["controller"]
    env = env_of(controller)
    assert env["GPUWM_API_TLS"]["value"] == "true"
    assert env["GPUWM_API_TOKEN_AUDIENCE"]["value"] == "gpuwm"
    # no files: the controller makes its CA and certificate once and keeps them in a Secret the chart does
    # not render (nothing random in the chart), made for the Service's names
    assert "GPUWM_API_TLS_CERT_FILE" not in env
    assert env["GPUWM_API_TLS_SECRET"]["value"] == "gpuwm-controller-tls"
    assert env["GPUWM_API_TLS_DNS_NAMES"]["value"] == ",".join([
        "gpuwm-controller", "gpuwm-controller.gpuwm", "gpuwm-controller.gpuwm.svc",
        "gpuwm-controller.gpuwm.svc.cluster.local"])
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert not installed.objects("Secret") and not installed.objects("Certificate")
    for probe in ("startupProbe", "readinessProbe"):
        assert controller[probe]["httpGet"]["scheme"] == "HTTPS"


@pytest.mark.parametrize(("values", "name"), [({}, "gpuwm-controller-tls"), ({"apiTlsSecret": "api-cert"}, "api-cert")])
def test_the_kept_certificates_secret_is_the_only_one_the_controller_may_touch(
    install: Callable[..., Installed], values: dict[str, Any], name: str,
) -> None:
    """A Role in the release namespace: get/update/patch on that one Secret by name, create on secrets (which
    RBAC cannot restrict by name); no list or watch; bound to the controller's ServiceAccount alone."""
    installed = install(values=values)
    assert installed.ok, installed.error
    role = installed.one("Role", "-controller-tls")
    assert role["metadata"]["namespace"] == "gpuwm"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [name], "verbs": ["get", "update", "patch"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    ]
    binding = installed.one("RoleBinding", "-controller-tls")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "gpuwm-controller-tls"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpuwm-controller", "namespace": "gpuwm"}]
    env = env_of(containers(installed.one("Deployment", "-controller"))["controller"])
    assert env["GPUWM_API_TLS_SECRET"]["value"] == name


@pytest.mark.parametrize("values", [
    {"apiTls": False}, {"controller": {"tls": {"source": "certManager", "issuerRef": {"name": "ca"}}}},
    {"controller": {"tls": {"source": "secret", "secretName": "mine"}}}, {"apiTlsCertFile": "/c", "apiTlsKeyFile": "/k"},
])
def test_no_access_to_secrets_where_the_controller_keeps_none(
    install: Callable[..., Installed], values: dict[str, Any],
) -> None:
    installed = install(values=values)
    assert installed.ok, installed.error
    # the state Secret (the controller's Role) is the only one it may touch then
    assert not [role for role in installed.objects("Role") if role["metadata"]["name"].endswith("-tls")]
    assert not [binding for binding in installed.objects("RoleBinding") if binding["metadata"]["name"].endswith("-tls")]
    assert "GPUWM_API_TLS_SECRET" not in env_of(containers(installed.one("Deployment", "-controller"))["controller"])


def test_cert_manager_certificate_is_mounted(install: Callable[..., Installed]) -> None:
    installed = install(values={"controller": {"tls": {"source": "certManager",
                                                         "issuerRef": {"name": "cluster-ca"}}}})
    assert installed.ok, installed.error
    certificate = installed.one("Certificate")
    spec = certificate["spec"]
    assert spec["secretName"] == "gpuwm-controller-tls"
    assert spec["issuerRef"] == {"name": "cluster-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    assert "gpuwm-controller.gpuwm.svc" in spec["dnsNames"]
    pod = installed.one("Deployment", "-controller")["spec"]["template"]["spec"]
    controller = containers(installed.one("Deployment", "-controller"))["controller"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "gpuwm-controller-tls"
    mounts = {mount["name"]: mount for mount in controller["volumeMounts"]}
    assert mounts["tls"] == {"name": "tls", "mountPath": "/etc/gpuwm/tls", "readOnly": True}
    env = env_of(controller)
    assert env["GPUWM_API_TLS_CERT_FILE"]["value"] == "/etc/gpuwm/tls/tls.crt"
    assert env["GPUWM_API_TLS_KEY_FILE"]["value"] == "/etc/gpuwm/tls/tls.key"


def test_cert_manager_needs_an_issuer_and_a_secret_source_needs_a_name(install: Callable[..., Installed]) -> None:
    no_issuer = install(values={"controller": {"tls": {"source": "certManager"}}})
    assert not no_issuer.ok and "issuerRef.name" in no_issuer.error
    no_name = install(values={"controller": {"tls": {"source": "secret"}}})
    assert not no_name.ok and "controller.tls.secretName" in no_name.error


def test_own_secret_is_mounted(install: Callable[..., Installed]) -> None:
    installed = install(values={"controller": {"tls": {"source": "secret", "secretName": "my-api-tls"}}})
    assert installed.ok, installed.error
    pod = installed.one("Deployment", "-controller")["spec"]["template"]["spec"]
    assert {"name": "tls", "secret": {"secretName": "my-api-tls", "defaultMode": 0o440}} in pod["volumes"]
    assert not installed.objects("Certificate")


def test_plain_http_when_asked(install: Callable[..., Installed]) -> None:
    installed = install(values={"apiTls": False, "controller": {"tls": {"source": "certManager",
                                                                          "issuerRef": {"name": "ca"}}}})
    assert installed.ok, installed.error
    controller = containers(installed.one("Deployment", "-controller"))["controller"]
    assert controller["readinessProbe"]["httpGet"]["scheme"] == "HTTP"
    assert not installed.objects("Certificate")
    assert "tls" not in {mount["name"] for mount in controller["volumeMounts"]}


def test_service_monitor_scrapes_https_with_a_token(install: Callable[..., Installed]) -> None:
    installed = install(values={
        "serviceMonitor": {"enabled": True},
        "prometheus": {"serviceAccount": {"name": "prometheus-k8s", "namespace": "monitoring"}},
        "controller": {"tls": {"source": "certManager", "issuerRef": {"name": "ca"}}},
    })
    assert installed.ok, installed.error
    (endpoint,) = installed.one("ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["path"] == "/metrics"
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "gpuwm-controller-tls", "key": "ca.crt"}
    assert endpoint["tlsConfig"]["serverName"] == "gpuwm-controller.gpuwm.svc"
    assert endpoint["bearerTokenFile"] == VALUES["serviceMonitor"]["bearerTokenFile"]
    # Prometheus' service account may get /metrics, nothing else
    reader = installed.one("ClusterRole", "-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    binding = installed.one("ClusterRoleBinding", "-metrics-reader")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}]


def test_service_monitor_token_from_a_secret(install: Callable[..., Installed]) -> None:
    """A token from a Secret instead of a file; the default certificate is verified with the kept Secret's CA."""
    secret = install(values={"serviceMonitor": {"enabled": True, "tokenSecret": {"name": "prom-token"}}})
    assert secret.ok, secret.error
    (endpoint,) = secret.one("ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": {"name": "prom-token", "key": "token"}}
    assert "bearerTokenFile" not in endpoint and "insecureSkipVerify" not in endpoint["tlsConfig"]
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "gpuwm-controller-tls", "key": "ca.crt"}
    assert endpoint["tlsConfig"]["serverName"] == "gpuwm-controller.gpuwm.svc"


def test_service_monitor_skips_verification_only_when_told(install: Callable[..., Installed]) -> None:
    skipped = install(values={"serviceMonitor": {"enabled": True, "insecureSkipVerify": True}})
    assert skipped.ok, skipped.error
    (endpoint,) = skipped.one("ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["tlsConfig"]["insecureSkipVerify"] is True and "ca" not in endpoint["tlsConfig"]


def test_the_controller_labels_its_pod_and_keeps_its_state_in_its_own_namespace(
    install: Callable[..., Installed],
) -> None:
    """A Role in the release namespace: patch on pods (the leader's label for the API's Service), get and patch
    on the one state Secret by name, create on secrets (which RBAC cannot restrict by name); nothing else."""
    installed = install()
    assert installed.ok, installed.error
    role = installed.one("Role", "gpuwm-controller")
    assert role["metadata"]["namespace"] == "gpuwm"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["gpuwm-controller-state"],
         "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    ]
    binding = installed.one("RoleBinding", "gpuwm-controller")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpuwm-controller", "namespace": "gpuwm"}]
    cluster_rules = installed.one("ClusterRole", "-controller")["rules"]
    assert not [rule for rule in cluster_rules if "pods" in rule["resources"] and "patch" in rule["verbs"]]
    env = env_of(containers(installed.one("Deployment", "-controller"))["controller"])
    assert env["GPUWM_STATE_SECRET"]["value"] == "gpuwm-controller-state"
