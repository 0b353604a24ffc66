"""The API's security: /metrics authorised, audience-bound tokens, bounded auth caches and review
rates, bounded answers (size before the read, heavy queries at once), steps and times it cannot represent."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuwm.api.app import create_app
from gpuwm.api.auth import KubernetesAuthorizer
from gpuwm.config import Settings
from gpuwm.store import RangeQuery, Series
from gpuwm.store.base import METRIC_NAMES
from gpuwm.store.embedded import EmbeddedStore
from tests.integration.kubeemu import EmulatorThread, KubernetesEmulator, grant_admin_reads
from tests.integration.kubeemu.reviews import UserInfo, service_account_user

from .api_data import populate

ADMIN = {"Authorization": "Bearer token-admin"}  # cluster-wide gpuworkloadmetrics, audience gpuwm
PROMETHEUS = {"Authorization": "Bearer token-prometheus"}  # get /metrics only, audience gpuwm
WRONG_AUDIENCE = {"Authorization": "Bearer token-admin-default-audience"}  # admin, but the API server's audience


@pytest.fixture
def emu() -> Iterator[EmulatorThread]:
    with EmulatorThread(KubernetesEmulator()) as thread:
        http = grant_admin_reads(thread)
        prometheus = service_account_user("monitoring", "prometheus")
        prometheus.audiences = ["gpuwm"]
        thread.emulator.reviews.tokens.update({
            "token-admin-default-audience": UserInfo("admin"),
            "token-prometheus": prometheus,
        })
        # what the chart's <release>-metrics-reader ClusterRole grants Prometheus
        http.create("/apis/rbac.authorization.k8s.io/v1/clusterroles", {
            "metadata": {"name": "gpuwm-metrics-reader"},
            "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
        })
        http.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "metadata": {"name": "gpuwm-metrics-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpuwm-metrics-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}],
        })
        yield thread


def _asked(emu: EmulatorThread, plural: str) -> list[Any]:
    return [record for record in emu.emulator.requests if record.path.endswith("/" + plural)]


@pytest.fixture
async def authorizer(emu: EmulatorThread) -> AsyncIterator[KubernetesAuthorizer]:
    made = KubernetesAuthorizer(emu.url, token="sa-token", cache_seconds=60, cache_entries=50,
                                reviews_per_client_per_second=4)
    yield made
    await made.close()


def _client(app: Any, address: str = "10.0.0.1") -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(address, 40000))
    return httpx.AsyncClient(transport=transport, base_url="https://gpuwm")


# -- 1. every data endpoint authorised, /metrics included -------------------------------------------


async def test_prometheus_metrics_need_a_token_and_the_non_resource_url(
    store: EmbeddedStore, authorizer: KubernetesAuthorizer, emu: EmulatorThread
) -> None:
    app = create_app(store, Settings(auth="kubernetes"), authorizer=authorizer)
    async with _client(app) as http:
        anonymous = await http.get("/metrics")
        assert anonymous.status_code == 401 and "gpuwm_" not in anonymous.text
        # cluster-wide read of gpuworkloadmetrics is not the /metrics URL: that needs its own rule
        admin = await http.get("/metrics", headers=ADMIN)
        assert admin.status_code == 403 and "nonResourceURLs" in admin.json()["message"]
        scraped = await http.get("/metrics", headers=PROMETHEUS)
        assert scraped.status_code == 200 and "gpuwm_workload" in scraped.text
        # Prometheus may scrape, not read the API's per-namespace data
        assert (await http.get("/api/v1/cluster/metrics", headers=PROMETHEUS)).status_code == 403
        # health stays open (kubelet probes carry no token)
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/readyz")).status_code == 200
    path_review = next(spec for spec in emu.emulator.reviews.asked if "nonResourceAttributes" in spec)
    assert path_review["nonResourceAttributes"] == {"verb": "get", "path": "/metrics"}


# -- 2. audience-bound tokens ------------------------------------------------------------------


async def test_a_token_for_another_audience_is_refused(
    store: EmbeddedStore, authorizer: KubernetesAuthorizer, emu: EmulatorThread
) -> None:
    app = create_app(store, Settings(auth="kubernetes"), authorizer=authorizer)
    async with _client(app) as http:
        refused = await http.get("/api/v1/cluster/metrics", headers=WRONG_AUDIENCE)
        assert refused.status_code == 401
        assert "--audience gpuwm" in refused.json()["message"]
        assert (await http.get("/api/v1/cluster/metrics", headers=ADMIN)).status_code == 200


async def test_the_audience_is_a_setting(store: EmbeddedStore, emu: EmulatorThread) -> None:
    emu.emulator.reviews.tokens["token-other"] = UserInfo("admin", audiences=["metrics.example.com"])
    authorizer = KubernetesAuthorizer(emu.url, token="sa-token", audience="metrics.example.com")
    app = create_app(store, Settings(auth="kubernetes", api_token_audience="metrics.example.com"),
                     authorizer=authorizer)
    async with _client(app) as http:
        assert (await http.get("/api/v1/cluster/metrics", headers={"Authorization": "Bearer token-other"})
                ).status_code == 200
        assert (await http.get("/api/v1/cluster/metrics", headers=ADMIN)).status_code == 401
    await authorizer.close()


async def test_an_audience_unaware_review_is_not_trusted() -> None:
    """A TokenReview answer that does not name our audience (an authenticator that ignores audiences)."""
    from gpuwm.api.auth import _reviewed_user

    status = {"authenticated": True, "user": {"username": "x"}}
    assert _reviewed_user(status, "gpuwm") is None
    assert _reviewed_user({**status, "audiences": ["gpuwm"]}, "gpuwm") is not None


# -- 5. bounded caches, a rate per client -------------------------------------------------------


async def test_auth_caches_are_bounded(store: EmbeddedStore, emu: EmulatorThread) -> None:
    authorizer = KubernetesAuthorizer(emu.url, token="sa-token", cache_seconds=3600, cache_entries=20,
                                      reviews_per_client_per_second=1000)
    app = create_app(store, Settings(auth="kubernetes"), authorizer=authorizer)
    async with _client(app) as http:
        for index in range(60):
            headers = {"Authorization": f"Bearer made-up-{index}"}
            assert (await http.get("/api/v1/cluster/metrics", headers=headers)).status_code == 401
        assert len(authorizer._users) == 20
        # the most recently used stay: a valid token used again costs no second review
        assert (await http.get("/api/v1/cluster/metrics", headers=ADMIN)).status_code == 200
        before = len(_asked(emu, "tokenreviews"))
        assert (await http.get("/api/v1/cluster/metrics", headers=ADMIN)).status_code == 200
        assert len(_asked(emu, "tokenreviews")) == before
    await authorizer.close()


async def test_reviews_are_rate_limited_per_client(store: EmbeddedStore, emu: EmulatorThread) -> None:
    """4 reviews a second, a burst of 20: made-up tokens from one address get 429 after that; others go on.

    The authorizer's clock stands still, so the bucket does not refill while the 40 requests run
    (on a loaded machine they can take longer than the quarter second one token takes to come back)."""
    authorizer = KubernetesAuthorizer(emu.url, token="sa-token", cache_seconds=60, cache_entries=50,
                                      reviews_per_client_per_second=4, clock=lambda: 1000.0)
    app = create_app(store, Settings(auth="kubernetes"), authorizer=authorizer)
    async with _client(app, "10.0.0.66") as attacker, _client(app, "10.0.0.7") as user:
        statuses = []
        for index in range(40):
            response = await attacker.get("/api/v1/cluster/metrics", headers={"Authorization": f"Bearer x-{index}"})
            statuses.append(response.status_code)
        assert statuses.count(401) == 20 and statuses.count(429) == 20
        limited = await attacker.get("/api/v1/cluster/metrics", headers={"Authorization": "Bearer x-last"})
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
        assert len(_asked(emu, "tokenreviews")) == 20
        assert (await user.get("/api/v1/cluster/metrics", headers=ADMIN)).status_code == 200
    await authorizer.close()


# -- 3. bounded answers ------------------------------------------------------------------------


class _Watched(EmbeddedStore):
    """Counts range reads; `gate` (when set) holds each read until released."""

    reads = 0
    gate: threading.Event | None = None

    def query_range(self, query: RangeQuery) -> list[Series]:
        type(self).reads += 1
        if self.gate is not None:
            self.gate.wait(10)
        return super().query_range(query)


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[_Watched]:
    populate(tmp_path / "gpuwm.db").close()
    opened = _Watched(tmp_path / "gpuwm.db")
    _Watched.reads, _Watched.gate = 0, None
    yield opened
    opened.close()


async def test_an_oversized_answer_is_refused_before_the_store_is_read(watched: _Watched) -> None:
    app = create_app(watched, Settings(auth="none", api_max_points_per_response=10_000))
    async with _client(app) as http:
        # 4 metrics x 2,001 points = 8,004: within the limit
        # (at the stored 15 s: a finer step would be answered at 15 s)
        fits = await http.get("/api/v1/cluster/metrics", params={"start": "0", "end": "30000", "step": "15"})
        assert fits.status_code == 200 and _Watched.reads == 1
        # every metric x 2,001 points by GPU over 3 GPUs
        every = ",".join(METRIC_NAMES)
        big = await http.get("/api/v1/cluster/metrics",
                             params={"start": "0", "end": "30000", "step": "15", "metric": every, "by": "gpu"})
    assert big.status_code == 400 and _Watched.reads == 1
    body = big.json()
    assert body["parameter"] == "step" and "apiMaxPointsPerResponse" in body["message"]
    assert f"{len(METRIC_NAMES) * 2001 * 3} points" in body["message"] and "coarser step" in body["message"]


async def test_heavy_queries_past_the_limit_get_429(watched: _Watched) -> None:
    """6 queries at once make 3 heavy slots, 2 of them for one user; a third heavy one waits its turn (0.3 s
    here), then 429."""
    app = create_app(watched, Settings(auth="none", api_max_points_per_response=100_000,
                                       api_max_concurrent_queries=6, api_max_concurrent_queries_per_user=4,
                                       api_query_queue_seconds=0.3))
    gate = _Watched.gate = threading.Event()
    heavy = {"start": "0", "end": "150000", "step": "15"}  # 4 x 10,001 points: over a twentieth of the limit
    async with _client(app) as http:
        running = [asyncio.create_task(http.get("/api/v1/cluster/metrics", params=heavy)) for _ in range(2)]
        while _Watched.reads < 2:
            await asyncio.sleep(0.01)
        third = await http.get("/api/v1/cluster/metrics", params=heavy)
        light = asyncio.create_task(http.get("/api/v1/cluster/metrics", params={"start": "0", "end": "100"}))
        await asyncio.sleep(0.05)
        gate.set()
        answers = await asyncio.gather(*running, light)
        assert third.status_code == 429 and third.headers["retry-after"] == "2"
        assert third.json()["error"] == "too_many_requests"
        assert [answer.status_code for answer in answers] == [200, 200, 200]
        # the slots are given back
        assert (await http.get("/api/v1/cluster/metrics", params=heavy)).status_code == 200


# -- steps and times the store cannot represent -----------------------------------


async def test_steps_past_what_the_store_holds_are_answered_at_its_bounds(store: EmbeddedStore) -> None:
    """A step longer than every time the API holds (it once overflowed the store's integers) is answered at that
    length, one point; one under a millisecond at the store's finest step, the step asked for said."""
    app = create_app(store, Settings(auth="none"))
    async with _client(app) as http:
        longest = await http.get("/api/v1/cluster/metrics", params={"step": "9999999999999999999s"})
        assert longest.status_code == 200 and longest.json()["step"] == 253402300799.0
        assert all(len(series["points"]) == 1 for series in longest.json()["series"])
        finest = await http.get("/api/v1/cluster/metrics", params={"step": "0.0001"})
        assert finest.status_code == 200 and finest.json()["step"] == 15.0 and finest.json()["requestedStep"] == 0.001


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ({"step": "1e19"}, "step"),
        ({"step": "1e300"}, "step"),
        ({"step": "1e-300"}, "step"),
        ({"start": "0001-01-01T00:00:00Z"}, "start"),
        ({"end": "1969-12-31T23:59:59Z"}, "end"),
        ({"start": "1e19"}, "start"),
    ],
)
async def test_steps_and_times_out_of_range_get_400_naming_them(
    store: EmbeddedStore, query: dict[str, str], parameter: str
) -> None:
    app = create_app(store, Settings(auth="none"))
    async with _client(app) as http:
        for path in ("/api/v1/cluster/metrics", "/api/v1/namespaces/team-a/workloads/train/metrics"):
            response = await http.get(path, params=query)
            assert response.status_code == 400, (path, query, response.text[:200])
            assert response.json()["parameter"] == parameter
            assert len(response.json()["message"]) < 300
