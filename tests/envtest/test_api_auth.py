"""`gpuwm api --auth=kubernetes` against the real TokenReview and SubjectAccessReview.

The API runs as its own ServiceAccount bound to `system:auth-delegator` (what lets a server ask the
reviews), over a store holding `train` in team-a and `notebook` in team-b. Users are ServiceAccounts
with tokens from the TokenRequest API: alice may read GPUWorkloadMetrics in team-a (a Role), carol
everywhere (a ClusterRole), bob nothing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.envtest.conftest import make_namespace
from tests.envtest.controlplane import ControlPlane, free_port
from tests.unit.api.api_data import populate

pytestmark = pytest.mark.envtest

AUDIENCE = "gpuwm-envtest"
API_NS = "gpuwm-api"
READ = [{"apiGroups": ["gpuwm.io"], "resources": ["gpuworkloadmetrics"], "verbs": ["get", "list", "watch"]}]


@dataclass
class Api:
    url: str
    context: ssl.SSLContext
    tokens: dict[str, str]

    def get(self, path: str, token: str | None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        request = urllib.request.Request(self.url + path, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=15, context=self.context) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")


def _service_account(plane: ControlPlane, namespace: str, name: str) -> dict[str, str]:
    plane.admin().create(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": name}})
    return {"kind": "ServiceAccount", "name": name, "namespace": namespace}


@pytest.fixture(scope="module")
def api(control_plane: ControlPlane, crds: list[str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    plane, http = control_plane, control_plane.admin()
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    for namespace in (API_NS, "team-a", "team-b"):
        make_namespace(plane, namespace)
    reviewer = _service_account(plane, API_NS, "metrics-api")
    http.create(f"{rbac}/clusterrolebindings", {
        "metadata": {"name": "envtest-metrics-api-auth-delegator"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:auth-delegator"},
        "subjects": [reviewer]})
    alice, bob = _service_account(plane, "team-a", "alice"), _service_account(plane, "team-a", "bob")
    carol = _service_account(plane, API_NS, "carol")
    http.create(f"{rbac}/namespaces/team-a/roles", {"metadata": {"name": "gpuwm-reader"}, "rules": READ})
    http.create(f"{rbac}/namespaces/team-a/rolebindings", {
        "metadata": {"name": "alice-reads"}, "subjects": [alice],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gpuwm-reader"}})
    http.create(f"{rbac}/clusterroles", {"metadata": {"name": "envtest-gpuwm-reader"}, "rules": READ})
    http.create(f"{rbac}/clusterrolebindings", {
        "metadata": {"name": "carol-reads-all"}, "subjects": [carol],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "envtest-gpuwm-reader"}})

    directory = tmp_path_factory.mktemp("api")
    populate(directory / "gpuwm.db").close()
    kubeconfig = plane.write_kubeconfig(directory / "kubeconfig", token=plane.token(API_NS, "metrics-api"))
    port = free_port()
    log = directory / "api.log"
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("GPUWM_", "KUBERNETES_"))}
    environment["KUBECONFIG"] = str(kubeconfig)
    with log.open("wb") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpuwm.cli", "api", "--store", str(directory / "gpuwm.db"), "--auth", "kubernetes",
             "--api-listen", f"127.0.0.1:{port}", "--api-token-audience", AUDIENCE,
             "--api-tls-cert-file", str(plane.pki / "apiserver.crt"),
             "--api-tls-key-file", str(plane.pki / "apiserver.key")],
            env=environment, stdout=handle, stderr=subprocess.STDOUT)
    context = ssl.create_default_context(cafile=str(plane.pki / "ca.crt"))
    tokens = {name: plane.token(sa["namespace"], sa["name"], audiences=[AUDIENCE])
              for name, sa in (("alice", alice), ("bob", bob), ("carol", carol))}
    tokens["alice-for-the-api-server"] = plane.token("team-a", "alice")  # the API server's own audience
    served = Api(f"https://127.0.0.1:{port}", context, tokens)
    try:
        deadline = time.monotonic() + 30
        while not re.search(r"listening", log.read_text()):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"gpuwm api did not start:\n{log.read_text()}"
            time.sleep(0.2)
        yield served
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def test_no_token_and_bad_tokens_get_401(api: Api) -> None:
    path = "/api/v1/namespaces/team-a/workloads/train"
    assert api.get(path, None)[0] == 401
    assert api.get(path, "not-a-token")[0] == 401
    # a real token of alice's, but issued for the API server, not for gpuwm: the TokenReview refuses it
    assert api.get(path, api.tokens["alice-for-the-api-server"])[0] == 401


def test_a_token_without_rights_gets_403(api: Api) -> None:
    status, answer = api.get("/api/v1/namespaces/team-a/workloads/train", api.tokens["bob"])
    assert status == 403, answer
    assert "system:serviceaccount:team-a:bob" in answer["message"]
    assert api.get("/api/v1/cluster/metrics", api.tokens["bob"])[0] == 403


def test_a_namespace_reader_sees_that_namespace_only(api: Api) -> None:
    alice = api.tokens["alice"]
    status, train = api.get("/api/v1/namespaces/team-a/workloads/train", alice)
    assert status == 200 and train["name"] == "train", train
    assert api.get("/api/v1/namespaces/team-a/workloads/train/metrics", alice)[0] == 200
    assert api.get("/api/v1/namespaces/team-b/workloads/notebook", alice)[0] == 403
    assert api.get("/api/v1/namespaces/team-b/workloads/notebook/metrics", alice)[0] == 403
    assert api.get("/api/v1/cluster/metrics", alice)[0] == 403
    listed = api.get("/api/v1/workloads", alice)
    assert listed[0] == 200 and [w["name"] for w in listed[1]["workloads"]] == ["train"], listed
    assert api.get("/api/v1/workloads?namespace=team-b", alice)[0] == 403


def test_a_cluster_wide_reader_sees_everything(api: Api) -> None:
    carol = api.tokens["carol"]
    listed = api.get("/api/v1/workloads", carol)
    assert listed[0] == 200 and sorted(w["name"] for w in listed[1]["workloads"]) == ["notebook", "train"]
    assert api.get("/api/v1/cluster/metrics", carol)[0] == 200
    assert api.get("/api/v1/namespaces/team-b/workloads/notebook", carol)[0] == 200


def test_unknown_and_forbidden_look_the_same(api: Api) -> None:
    """bob may read nothing: a run and a project that exist in namespaces he may not read are answered as ones
    that do not (alice's token names train's UID in the list)."""
    bob = api.tokens["bob"]
    uid = api.get("/api/v1/workloads", api.tokens["carol"])[1]["workloads"][0]["uid"]
    forbidden, unknown = api.get(f"/api/v1/workloads/{uid}", bob), api.get("/api/v1/workloads/no-such-uid", bob)
    assert forbidden[0] == unknown[0] == 404
    assert forbidden[1]["message"] == unknown[1]["message"].replace("no-such-uid", uid)
    project, nothing = api.get("/api/v1/projects/alpha/metrics", bob), api.get("/api/v1/projects/gamma/metrics", bob)
    assert project[0] == nothing[0] == 404
    assert "team-a" not in json.dumps(forbidden[1]) + json.dumps(project[1])


def test_forged_forwarding_headers_are_one_client(api: Api) -> None:
    """Made-up tokens over loopback, each with a new X-Forwarded-For: the API trusts no proxy by default, so they
    are one client held to 10 reviews a second (a burst of 50), and the real API server is asked that many.
    Last in the module: it spends loopback's review budget."""
    statuses = []
    started = time.monotonic()
    for index in range(150):
        request = urllib.request.Request(api.url + "/api/v1/workloads", headers={
            "Authorization": f"Bearer made-up-{index}", "X-Forwarded-For": f"198.51.100.{index}"})
        try:
            with urllib.request.urlopen(request, timeout=15, context=api.context) as response:
                statuses.append(response.status)
        except urllib.error.HTTPError as error:
            statuses.append(error.code)
    elapsed = time.monotonic() - started
    reviewed = statuses.count(401)  # each a TokenReview the real API server answered
    assert set(statuses) == {401, 429}, statuses
    assert reviewed <= 50 + 10 * elapsed + 1, (reviewed, elapsed)
    assert statuses.count(429) >= 150 - (50 + 10 * elapsed + 1)
