"""--auth=kubernetes: TokenReview and SubjectAccessReview through the Kubernetes API emulator (RBAC behind it)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from gpuwm.api.app import create_app
from gpuwm.api.auth import KubernetesAuthorizer
from gpuwm.config import Settings
from gpuwm.store.embedded import EmbeddedStore
from tests.integration.kubeemu import EmulatorThread, KubeHttp, KubernetesEmulator
from tests.integration.kubeemu.reviews import UserInfo, rbac_objects, service_account_user

ALICE = {"Authorization": "Bearer token-alice"}  # may read team-a only
ADMIN = {"Authorization": "Bearer token-admin"}  # cluster-wide


@pytest.fixture
def emu() -> Iterator[EmulatorThread]:
    """alice may read team-a (a Role), admin everything (a ClusterRole); gpuwm's service account asks the reviews."""
    with EmulatorThread(KubernetesEmulator()) as thread:
        thread.emulator.reviews.tokens.update({
            "sa-token": service_account_user("gpuwm", "gpuwm-controller"),
            "token-alice": UserInfo("alice", audiences=["gpuwm"]), "token-admin": UserInfo("admin", audiences=["gpuwm"]),
        })
        http = KubeHttp(thread.url)
        for namespace in ("team-a", "team-b"):
            http.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
        rules = [{"apiGroups": ["gpuwm.io"], "resources": ["gpuworkloadmetrics"], "verbs": ["get", "list", "watch"]}]
        for path, _, body in rbac_objects(
            {"team-a": [{"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"}]},
            [{"kind": "User", "name": "admin", "apiGroup": "rbac.authorization.k8s.io"}], rules,
            reviewer={"kind": "ServiceAccount", "name": "gpuwm-controller", "namespace": "gpuwm"},
        ):
            http.create(path, body)
        yield thread


def _asked(emu: EmulatorThread, plural: str) -> int:
    return sum(1 for record in emu.emulator.requests if record.path.endswith("/" + plural))


@pytest.fixture
async def client(store: EmbeddedStore, emu: EmulatorThread) -> AsyncIterator[httpx.AsyncClient]:
    authorizer = KubernetesAuthorizer(emu.url, token="sa-token", cache_seconds=60)
    app = create_app(store, Settings(auth="kubernetes"), authorizer=authorizer)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
        yield http
    await authorizer.close()


async def test_missing_and_bad_tokens_get_401(client: httpx.AsyncClient) -> None:
    missing = await client.get("/api/v1/namespaces/team-a/workloads/train")
    assert missing.status_code == 401 and "bearer token" in missing.json()["message"]
    assert missing.headers["www-authenticate"].startswith("Bearer")
    bad = await client.get(
        "/api/v1/namespaces/team-a/workloads/train", headers={"Authorization": "Bearer nope"}
    )
    assert bad.status_code == 401 and bad.json()["error"] == "unauthorized"


async def test_namespace_access(client: httpx.AsyncClient, emu: EmulatorThread) -> None:
    assert (await client.get("/api/v1/namespaces/team-a/workloads/train", headers=ALICE)).status_code == 200
    metrics = await client.get("/api/v1/namespaces/team-a/workloads/train/metrics", headers=ALICE)
    assert metrics.status_code == 200
    denied = await client.get("/api/v1/namespaces/team-b/workloads/notebook/metrics", headers=ALICE)
    assert denied.status_code == 403
    assert denied.json()["message"].startswith(
        "user 'alice' may not get gpuworkloadmetrics.gpuwm.io in namespace 'team-b'"
    )
    # the SubjectAccessReview carried the user the TokenReview returned
    asked = emu.emulator.reviews.asked[-1]
    assert asked["user"] == "alice" and "system:authenticated" in asked["groups"]
    assert asked["resourceAttributes"] == {
        "verb": "get", "group": "gpuwm.io", "resource": "gpuworkloadmetrics", "namespace": "team-b"
    }


async def test_cluster_scope_needs_cluster_wide_access(client: httpx.AsyncClient) -> None:
    assert (await client.get("/api/v1/cluster/metrics", headers=ALICE)).status_code == 403
    assert (await client.get("/api/v1/nodes/node-a/metrics", headers=ALICE)).status_code == 403
    assert (await client.get("/api/v1/cluster/metrics", headers=ADMIN)).status_code == 200


async def test_projects_need_every_namespace(client: httpx.AsyncClient) -> None:
    assert (await client.get("/api/v1/projects/alpha/metrics", headers=ALICE)).status_code == 200
    # a project in a namespace alice may not read is answered as one that does not exist
    forbidden = await client.get("/api/v1/projects/beta/metrics", headers=ALICE)
    unknown = await client.get("/api/v1/projects/gamma/metrics", headers=ALICE)
    assert forbidden.status_code == unknown.status_code == 404
    assert forbidden.json()["message"] == unknown.json()["message"].replace("gamma", "beta")
    assert "team-b" not in forbidden.text
    assert (await client.get("/api/v1/projects/beta/metrics", headers=ADMIN)).status_code == 200
    listed = (await client.get("/api/v1/projects", headers=ALICE)).json()
    assert [p["name"] for p in listed["projects"]] == ["alpha"]


@pytest.mark.parametrize("path", ["/api/v1/workloads/{uid}", "/api/v1/workloads/{uid}/metrics"])
async def test_runs_by_uid_elsewhere_look_unknown(client: httpx.AsyncClient, path: str) -> None:
    """A UID in a namespace the caller may not read and one that does not exist get the same answer: no
    UID, and no namespace, can be learnt by probing."""
    notebook = next(w for w in (await client.get("/api/v1/workloads", headers=ADMIN)).json()["workloads"]
                    if w["name"] == "notebook")
    uid = notebook["uid"]
    assert (await client.get(path.format(uid=uid), headers=ADMIN)).status_code == 200
    forbidden = await client.get(path.format(uid=uid), headers=ALICE)
    unknown = await client.get(path.format(uid="no-such-uid"), headers=ALICE)
    assert forbidden.status_code == unknown.status_code == 404
    assert forbidden.json()["message"] == unknown.json()["message"].replace("no-such-uid", uid)
    assert "team-b" not in forbidden.text
    # without a token, nothing either way
    assert (await client.get(path.format(uid=uid))).status_code == 401


async def test_lists_are_filtered_to_what_the_user_may_read(client: httpx.AsyncClient) -> None:
    alice = (await client.get("/api/v1/workloads", headers=ALICE)).json()
    assert [w["name"] for w in alice["workloads"]] == ["train"]
    admin = (await client.get("/api/v1/workloads", headers=ADMIN)).json()
    assert sorted(w["name"] for w in admin["workloads"]) == ["notebook", "train"]
    assert (await client.get("/api/v1/workloads?namespace=team-b", headers=ALICE)).status_code == 403


async def test_reviews_are_cached(client: httpx.AsyncClient, emu: EmulatorThread) -> None:
    for _ in range(5):
        assert (
            await client.get("/api/v1/namespaces/team-a/workloads/train", headers=ALICE)
        ).status_code == 200
    assert _asked(emu, "tokenreviews") == 1
    # one cluster-wide review (denied) and one for team-a, each asked once
    assert _asked(emu, "subjectaccessreviews") == 2


async def test_kubernetes_api_down_gives_503(store: EmbeddedStore) -> None:
    authorizer = KubernetesAuthorizer("http://127.0.0.1:9", token="sa-token", timeout_seconds=2)
    app = create_app(store, Settings(auth="kubernetes"), authorizer=authorizer)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
        response = await http.get("/api/v1/cluster/metrics", headers=ADMIN)
    await authorizer.close()
    assert response.status_code == 503 and "cannot reach the Kubernetes API" in response.json()["message"]


async def test_credentials_from_a_kubeconfig(tmp_path: Path, emu: EmulatorThread) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
        f"clusters:\n- name: test\n  cluster:\n    server: {emu.url}\n"
        "users:\n- name: gpuwm\n  user:\n    token: sa-token\n"
        "contexts:\n- name: test\n  context:\n    cluster: test\n    user: gpuwm\n"
    )
    authorizer = KubernetesAuthorizer.from_environment(kubeconfig=str(kubeconfig))
    try:
        assert authorizer.api_url == emu.url
        user = await authorizer.authenticate("token-alice")
        assert user.username == "alice" and await authorizer.allowed(user, "team-a")
        assert not await authorizer.allowed(user, "team-b")
    finally:
        await authorizer.close()


async def test_a_service_account_without_review_rights_gets_a_clear_503(
    store: EmbeddedStore, emu: EmulatorThread
) -> None:
    """The API server answers 403 to gpuwm's own reviews: say which rights the service account lacks."""
    emu.emulator.reviews.tokens["bare-token"] = service_account_user("gpuwm", "no-rbac")
    authorizer = KubernetesAuthorizer(emu.url, token="bare-token")
    app = create_app(store, Settings(auth="kubernetes"), authorizer=authorizer)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
        response = await http.get("/api/v1/cluster/metrics", headers=ADMIN)
    await authorizer.close()
    assert response.status_code == 503
    message = response.json()["message"]
    assert "HTTP 403" in message and "needs create on tokenreviews and subjectaccessreviews" in message
