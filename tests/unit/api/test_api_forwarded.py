"""Who the client is: the connection's peer, unless a proxy the operator names says otherwise in
X-Forwarded-For; the review rates count per that client, and TokenReviews across all clients."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gpuwm.api.app import create_app
from gpuwm.api.auth import KubernetesAuthorizer
from gpuwm.config import Settings
from gpuwm.store.embedded import EmbeddedStore
from tests.integration.kubeemu import EmulatorThread, KubernetesEmulator, grant_admin_reads


@pytest.fixture
def emu() -> Iterator[EmulatorThread]:
    with EmulatorThread(KubernetesEmulator()) as thread:
        grant_admin_reads(thread)
        yield thread


def _token_reviews(emu: EmulatorThread) -> int:
    return sum(1 for record in emu.emulator.requests if record.path.endswith("/tokenreviews"))


def _client(app: Any, peer: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(peer, 40000))
    return httpx.AsyncClient(transport=transport, base_url="https://gpuwm")


def _authorizer(
    emu: EmulatorThread, reviews_per_client_per_second: float, token_reviews_per_second: float = 50.0
) -> KubernetesAuthorizer:
    """A frozen clock: no bucket refills while a test's requests run, however slow the machine."""
    return KubernetesAuthorizer(
        emu.url, token="sa-token", cache_seconds=60, clock=lambda: 1000.0,
        reviews_per_client_per_second=reviews_per_client_per_second, token_reviews_per_second=token_reviews_per_second,
    )


async def test_forged_forwarding_headers_are_the_peer_by_default(store: EmbeddedStore, emu: EmulatorThread) -> None:
    """Made-up tokens from one peer, each with a new X-Forwarded-For: limited as one client (4/s, a burst of 20)."""
    authorizer = _authorizer(emu, reviews_per_client_per_second=4)
    app = create_app(store, Settings(auth="kubernetes"), authorizer=authorizer)
    async with _client(app, "127.0.0.1") as http:
        statuses = []
        for index in range(60):
            forged = {"Authorization": f"Bearer made-up-{index}", "X-Forwarded-For": f"203.0.113.{index}"}
            statuses.append((await http.get("/api/v1/cluster/metrics", headers=forged)).status_code)
    assert statuses.count(401) == 20 and statuses.count(429) == 40
    assert _token_reviews(emu) == 20
    await authorizer.close()


async def test_a_trusted_proxy_names_the_client(store: EmbeddedStore, emu: EmulatorThread) -> None:
    """Behind a proxy the operator names, each forwarded address is a client of its own; the proxy's own
    address is never one, and a peer that is not the proxy is itself the client whatever it sends."""
    authorizer = _authorizer(emu, reviews_per_client_per_second=1)  # a burst of 5
    app = create_app(store, Settings(auth="kubernetes", api_trusted_proxies="10.0.0.0/24"), authorizer=authorizer)
    async with _client(app, "10.0.0.9") as proxy, _client(app, "192.0.2.1") as direct:
        for index in range(10):  # ten clients behind the proxy, 10 reviews, none refused
            forwarded = {"Authorization": f"Bearer a-{index}", "X-Forwarded-For": f"198.51.100.{index}"}
            assert (await proxy.get("/api/v1/cluster/metrics", headers=forwarded)).status_code == 401
        # one client behind the proxy: its own burst of 5
        one = [(await proxy.get("/api/v1/cluster/metrics", headers={
            "Authorization": f"Bearer b-{index}", "X-Forwarded-For": "198.51.100.200"})).status_code
            for index in range(8)]
        assert one.count(401) == 5 and one.count(429) == 3
        # not the proxy: the header is ignored
        forged = [(await direct.get("/api/v1/cluster/metrics", headers={
            "Authorization": f"Bearer c-{index}", "X-Forwarded-For": f"198.51.100.{100 + index}"})).status_code
            for index in range(8)]
        assert forged.count(401) == 5 and forged.count(429) == 3
    await authorizer.close()


async def test_token_reviews_are_capped_across_clients(store: EmbeddedStore, emu: EmulatorThread) -> None:
    """Made-up tokens from many peers: each within its own rate, all together held to 2/s (a burst of 10);
    a token reviewed before the flood goes on from the cache."""
    authorizer = _authorizer(emu, reviews_per_client_per_second=100, token_reviews_per_second=2)
    app = create_app(store, Settings(auth="kubernetes"), authorizer=authorizer)
    admin = {"Authorization": "Bearer token-admin"}
    async with _client(app, "10.1.0.1") as user:
        assert (await user.get("/api/v1/cluster/metrics", headers=admin)).status_code == 200
        statuses = []
        for index in range(30):
            async with _client(app, f"10.2.0.{index}") as attacker:
                made_up = {"Authorization": f"Bearer made-up-{index}"}
                statuses.append((await attacker.get("/api/v1/cluster/metrics", headers=made_up)).status_code)
        assert statuses.count(401) == 9 and statuses.count(429) == 21
        refused = await user.get("/api/v1/cluster/metrics", headers={"Authorization": "Bearer another"})
        assert refused.status_code == 429 and "apiTokenReviewsPerSecond" in refused.json()["message"]
        assert int(refused.headers["retry-after"]) >= 1
        assert (await user.get("/api/v1/cluster/metrics", headers=admin)).status_code == 200
    assert _token_reviews(emu) == 10
    await authorizer.close()


@pytest.mark.parametrize("value", ["proxy.example.com", "10.0.0.0/33", "*"])
def test_trusted_proxies_must_be_addresses(value: str) -> None:
    from gpuwm.cli import build_parser
    from gpuwm.config import ConfigError, settings_from_arguments

    arguments = build_parser().parse_args(["api", "--store", "/tmp/x.db", "--api-trusted-proxies", value])
    with pytest.raises(ConfigError, match=r"--api-trusted-proxies.*not an IP address or network"):
        settings_from_arguments(arguments, ("api_trusted_proxies",))


def test_trusted_proxies_take_addresses_and_networks() -> None:
    settings = Settings(api_trusted_proxies="10.0.0.7, 10.1.0.0/16,fd00::/8")
    assert settings.api_trusted_proxies == ["10.0.0.7", "10.1.0.0/16", "fd00::/8"]
    assert Settings().api_trusted_proxies == []
