"""The controller's API client: retries 429/5xx with backoff, re-logs in on 401, discovery for unknown kinds."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from gpuwm import __version__
from gpuwm.controller.kube.client import KubeApiError, KubeClient, resource_path

from .loopback import serving


class Api:
    def __init__(self) -> None:
        self.answers: list[tuple[int, dict[str, Any], dict[str, str]]] = []
        self.seen: list[tuple[str, str, str | None]] = []
        self.agents: list[str] = []
        self.peers: set[object] = set()  # client addresses: one per connection
        self.bodies: list[tuple[str | None, bytes]] = []  # each request's Content-Type and body

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append((request.method, request.path_qs, request.headers.get("Authorization")))
        self.bodies.append((request.headers.get("Content-Type"), await request.read()))
        self.agents.append(request.headers.get("User-Agent", ""))
        self.peers.add(request.transport.get_extra_info("peername") if request.transport else None)
        if request.path == "/apis/example.com/v1":
            return web.json_response({"resources": [{"name": "widgets", "kind": "Widget"},
                                                    {"name": "widgets/status", "kind": "Widget"}]})
        status, body, headers = self.answers.pop(0) if self.answers else (200, {"ok": True}, {})
        return web.json_response(body, status=status, headers=headers)


@pytest.fixture
async def api() -> AsyncIterator[tuple[Api, str]]:
    state = Api()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", state.handle)
    async with serving(app) as url:
        yield state, url


async def test_retries_429_and_5xx_then_succeeds(api: tuple[Api, str]) -> None:
    state, url = api
    state.answers = [(429, {"message": "slow down"}, {"Retry-After": "0"}), (503, {}, {}), (200, {"v": 1}, {})]
    client = KubeClient(url, retry_backoffs_seconds=(0.01, 0.01, 0.01))
    assert await client.get("/api/v1/pods") == {"v": 1}
    assert client.retries == 2
    await client.close()


async def test_gives_up_with_an_error_naming_the_call(api: tuple[Api, str]) -> None:
    state, url = api
    state.answers = [(500, {"message": "boom"}, {})] * 3
    client = KubeClient(url, retry_backoffs_seconds=(0.01, 0.01))
    with pytest.raises(KubeApiError, match=r"PATCH /x: HTTP 500: boom"):
        await client.merge_patch("/x", {"a": 1})
    state.answers = [(422, {"message": "spec.x: Invalid value"}, {})]
    with pytest.raises(KubeApiError, match="Invalid value") as caught:
        await client.create("/y", {})
    assert caught.value.status == 422 and len(state.seen) == 4  # 4xx is not retried
    await client.close()


async def test_404_get_is_none_and_403_owner_is_none(api: tuple[Api, str]) -> None:
    state, url = api
    client = KubeClient(url, retry_backoffs_seconds=())
    state.answers = [(404, {}, {})]
    assert await client.get("/api/v1/namespaces/x/pods/y") is None
    state.answers = [(403, {"message": "forbidden"}, {})]
    assert await client.get_object("batch/v1", "Job", "ns", "j") is None
    await client.close()


async def test_discovery_finds_an_unknown_kind(api: tuple[Api, str]) -> None:
    state, url = api
    client = KubeClient(url)
    assert await client.plural("example.com/v1", "Widget") == "widgets"
    assert await client.get_object("example.com/v1", "Widget", "ns", "w") == {"ok": True}
    assert state.seen[-1][1] == "/apis/example.com/v1/namespaces/ns/widgets/w"
    assert await client.plural("example.com/v1", "Gadget") is None
    await client.close()


async def test_relogin_on_401(api: tuple[Api, str]) -> None:
    state, url = api
    state.answers = [(401, {"message": "token expired"}, {})]
    client = KubeClient(url, headers={"Authorization": "Bearer old"}, relogin=lambda: {"Authorization": "Bearer new"})
    assert await client.get("/api/v1/pods") == {"ok": True}
    assert [auth for _, _, auth in state.seen] == ["Bearer old", "Bearer new"]
    await client.close()


def test_resource_path() -> None:
    assert resource_path("v1", "pods", "ns", "p") == "/api/v1/namespaces/ns/pods/p"
    assert resource_path("gpuwm.io/v1alpha1", "gpuprojectmetrics", None, "x", "status") == \
        "/apis/gpuwm.io/v1alpha1/gpuprojectmetrics/x/status"


async def test_an_owner_kind_that_is_not_served_is_warned_about_once(
    api: tuple[Api, str], caplog: pytest.LogCaptureFixture
) -> None:
    state, url = api
    not_found = {"kind": "Status", "reason": "NotFound", "message": "the server could not find the requested resource"}
    # the object GET and then the discovery of kubeflow.org/v1: no CRD installed
    state.answers = [(404, not_found, {}), (404, not_found, {}), (404, not_found, {})]
    client = KubeClient(url, retry_backoffs_seconds=(0.01,))
    assert await client.get_object("kubeflow.org/v1", "PyTorchJob", "ns", "pt") is None
    assert await client.get_object("kubeflow.org/v1", "PyTorchJob", "ns", "pt2") is None
    paths = [path for _, path, _ in state.seen]
    assert paths == ["/apis/kubeflow.org/v1/namespaces/ns/pytorchjobs/pt", "/apis/kubeflow.org/v1",
                     "/apis/kubeflow.org/v1/namespaces/ns/pytorchjobs/pt2"]  # discovery asked once
    assert caplog.text.count("kubeflow.org/v1 PyTorchJob is not served") == 1
    state.answers = [(403, {"reason": "Forbidden", "message": 'cannot get resource "jobs"'}, {})]
    assert await client.get_object("batch/v1", "Job", "ns", "j") is None
    assert "batch/v1 Job cannot be read" in caplog.text and "extraOwnerRules" in caplog.text
    await client.close()


async def test_a_served_kind_with_a_missing_object_is_not_warned_about(
    api: tuple[Api, str], caplog: pytest.LogCaptureFixture
) -> None:
    state, url = api
    state.answers = [(404, {"reason": "NotFound", "message": 'widgets.example.com "w" not found'}, {})]
    client = KubeClient(url, retry_backoffs_seconds=(0.01,))
    assert await client.get_object("example.com/v1", "Widget", "ns", "w") is None
    assert "not served" not in caplog.text
    await client.close()


async def test_requests_name_the_controller(api: tuple[Api, str]) -> None:
    state, url = api
    client = KubeClient(url, headers={"Authorization": "Bearer t"})
    await client.get("/api/v1/pods")
    await client.close()
    assert state.agents == [f"gpuwm-controller/{__version__}"]


async def test_answers_are_parsed_whole_over_one_kept_alive_connection(api: tuple[Api, str]) -> None:
    state, url = api
    answer = {"metadata": {"generation": 3, "resourceVersion": "17"}, "status": {"v": [1.5, None, "é"]}}
    state.answers = [(200, answer, {})] * 5
    client = KubeClient(url)
    for _ in range(5):
        assert await client.merge_patch("/x/status", {"status": {"v": 1}}) == answer
    assert len(state.peers) == 1  # one connection, reused
    await client.close()


STATUS = "/apis/gpuwm.io/v1alpha1/namespaces/ns/gpuworkloadmetrics/w/status"


async def test_status_writes_keep_the_rules_of_every_call(api: tuple[Api, str]) -> None:
    """A status write's retries (Retry-After), giving up, 404, 401 and answer, over one kept-alive connection."""
    state, url = api
    answer = {"metadata": {"generation": 2}, "status": {"idleSeconds": None}}
    state.answers = [(429, {"message": "slow down"}, {"Retry-After": "0"}), (503, {}, {}), (200, answer, {})]
    client = KubeClient(url, headers={"Authorization": "Bearer old"}, retry_backoffs_seconds=(0.01, 0.01),
                        relogin=lambda: {"Authorization": "Bearer new"})
    try:
        assert await client.merge_patch(STATUS, {"status": {"idleSeconds": float("nan")}}, nan_as_null=True) == answer
        assert client.retries == 2 and len(state.peers) == 1
        assert [seen[:2] for seen in state.seen] == [("PATCH", STATUS + "?fieldManager=gpuwm")] * 3
        assert state.bodies[-1] == ("application/merge-patch+json", b'{"status":{"idleSeconds":null}}')
        assert state.agents[-1] == f"gpuwm-controller/{__version__}" and state.seen[-1][2] == "Bearer old"
        state.answers = [(500, {"message": "boom"}, {})] * 3
        with pytest.raises(KubeApiError, match=rf"PATCH {STATUS}: HTTP 500: boom"):
            await client.merge_patch(STATUS, {"status": {}}, nan_as_null=True)
        state.answers = [(404, {"message": "not found"}, {})]
        with pytest.raises(KubeApiError) as caught:  # the writer creates the CR again on a 404
            await client.merge_patch(STATUS, {"status": {}}, nan_as_null=True)
        assert caught.value.status == 404
        state.answers = [(401, {"message": "token expired"}, {})]
        assert await client.merge_patch(STATUS, {"status": {}}) == {"ok": True}
        assert [seen[2] for seen in state.seen[-2:]] == ["Bearer old", "Bearer new"]
        assert len(state.peers) == 2  # one connection until the relogin closed it
    finally:
        await client.close()


async def test_status_writes_over_https_with_a_client_certificate(tmp_path: Any) -> None:
    """Status writes use the TLS settings the client was given: the cluster CA and the client certificate."""
    from tests.integration.kubeemu.tls import make_pki

    pki, other = make_pki(tmp_path / "pki"), make_pki(tmp_path / "other")
    state = Api()
    async with serving(_app_of(state), pki.server_context()) as url:
        trusted = KubeClient(url, ssl_context=pki.client_context())
        stranger = KubeClient(url, ssl_context=other.client_context(), retry_backoffs_seconds=())
        try:
            assert await trusted.merge_patch(STATUS, {"status": {"v": 1}}, nan_as_null=True) == {"ok": True}
            assert state.seen == [("PATCH", STATUS + "?fieldManager=gpuwm", None)]
            with pytest.raises(KubeApiError, match="connection failed") as caught:  # a server its CA did not sign
                await stranger.merge_patch(STATUS, {"status": {"v": 1}}, nan_as_null=True)
            assert caught.value.status == 0 and len(state.seen) == 1
        finally:
            await trusted.close()
            await stranger.close()


def _app_of(state: Api) -> web.Application:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", state.handle)
    return app


async def test_inline_kubeconfig_credentials_leave_no_files_behind(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kubeconfig's inline CA, client certificate and key (kopf's `ConnectionInfo` with *_data) are read
    through temporary files that are gone once the TLS context holds them; the client still authenticates."""
    import base64
    import tempfile
    from types import SimpleNamespace

    from tests.integration.kubeemu.tls import make_pki

    pki = make_pki(tmp_path / "pki")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    state = Api()
    async with serving(_app_of(state), pki.server_context()) as url:
        info = SimpleNamespace(
            server=url, insecure=False, scheme=None, token=None,
            username=None, password=None, ca_path=None, certificate_path=None, private_key_path=None,
            ca_data=base64.b64encode(pki.ca.certificate).decode(),  # base64, as a kubeconfig holds it
            certificate_data=pki.client.certificate.decode(),  # PEM, as kopf may pass it
            private_key_data=base64.b64encode(pki.client.key).decode(),
        )
        client = KubeClient.from_connection_info(info)
        try:
            assert list(scratch.iterdir()) == []
            assert await client.merge_patch(STATUS, {"status": {"v": 1}}) == {"ok": True}
            assert await client.get(STATUS) == {"ok": True}  # aiohttp's requests: the same context
        finally:
            await client.close()
