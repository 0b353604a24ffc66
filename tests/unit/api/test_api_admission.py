"""The admission gate: every query through one fair queue (bounded at once and per user, a deadline, 429 with
Retry-After), the probes and /metrics beside it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuwm.api.admission import WAITING_PER_SLOT, AdmissionGate, SlotPool
from gpuwm.api.app import create_app
from gpuwm.api.auth import User
from gpuwm.api.http import TooBusy
from gpuwm.config import Settings
from gpuwm.store import RangeQuery, Series, WorkloadPeriod
from gpuwm.store.embedded import EmbeddedStore

from .api_data import populate

# -- the pool alone ------------------------------------------------------------------------------


async def test_a_pool_bounds_slots_at_once_and_per_identity() -> None:
    pool = SlotPool("queries", slots=3, per_identity=2, queue_seconds=5)
    await pool.acquire("alice")
    await pool.acquire("alice")
    third = asyncio.create_task(pool.acquire("alice"))  # alice holds her two: waits
    await asyncio.sleep(0.01)
    assert not third.done() and pool.waiting == 1
    await pool.acquire("bob")  # bob is not behind alice's queue
    assert pool.held_total == 3
    pool.release("bob")  # a free slot, and alice still holds her two: she keeps waiting
    await asyncio.sleep(0.01)
    assert not third.done()
    pool.release("alice")
    await asyncio.wait_for(third, 1)
    assert pool.held == {"alice": 2}


async def test_a_freed_slot_goes_to_the_user_with_the_fewest_running() -> None:
    pool = SlotPool("queries", slots=2, per_identity=2, queue_seconds=5)
    await pool.acquire("alice")
    await pool.acquire("alice")
    order: list[str] = []

    async def wait(identity: str) -> None:
        await pool.acquire(identity)
        order.append(identity)

    tasks = [asyncio.create_task(wait(name)) for name in ("alice", "alice", "bob")]
    await asyncio.sleep(0.01)
    pool.release("alice")  # alice holds one, bob none: bob first though alice asked first
    await asyncio.sleep(0.01)
    assert order == ["bob"]
    pool.release("alice")  # alice now holds none, bob one: alice's earliest
    await asyncio.sleep(0.01)
    assert order == ["bob", "alice"]
    pool.release("bob")
    await asyncio.wait_for(asyncio.gather(*tasks), 1)
    assert order == ["bob", "alice", "alice"]


async def test_a_waiter_past_the_deadline_gets_429_and_leaves_the_queue() -> None:
    pool = SlotPool("queries", slots=1, per_identity=1, queue_seconds=0.05)
    await pool.acquire("alice")
    started = time.monotonic()
    with pytest.raises(TooBusy) as refused:
        await pool.acquire("bob")
    assert time.monotonic() - started >= 0.05
    assert refused.value.retry_after_seconds >= 1 and "waited" in refused.value.message
    assert pool.waiting == 0
    pool.release("alice")
    assert pool.held_total == 0


async def test_a_user_cannot_queue_without_bound() -> None:
    pool = SlotPool("queries", slots=1, per_identity=1, queue_seconds=5)
    await pool.acquire("mallory")
    waiting = [asyncio.create_task(pool.acquire("mallory")) for _ in range(WAITING_PER_SLOT)]
    await asyncio.sleep(0.01)
    with pytest.raises(TooBusy, match="queue is full"):
        await pool.acquire("mallory")
    bob = asyncio.create_task(pool.acquire("bob"))  # another user still queues, and is served first
    await asyncio.sleep(0.01)
    pool.release("mallory")
    await asyncio.wait_for(bob, 1)
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    assert pool.waiting == 0 and pool.held == {"bob": 1}


async def test_a_waiter_that_goes_away_holds_nothing() -> None:
    pool = SlotPool("queries", slots=1, per_identity=1, queue_seconds=5)
    await pool.acquire("alice")
    gone = asyncio.create_task(pool.acquire("bob"))
    await asyncio.sleep(0.01)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    pool.release("alice")
    assert pool.waiting == 0 and pool.held_total == 0


def test_heavy_slots_are_half_of_the_queries_and_no_user_holds_them_all() -> None:
    assert (AdmissionGate.of(4, 2, 10).heavy.slots, AdmissionGate.of(4, 2, 10).heavy.per_identity) == (2, 1)
    assert (AdmissionGate.of(5, 2, 10).heavy.slots, AdmissionGate.of(5, 2, 10).heavy.per_identity) == (3, 2)
    assert (AdmissionGate.of(8, 8, 10).heavy.slots, AdmissionGate.of(8, 8, 10).heavy.per_identity) == (4, 3)
    assert (AdmissionGate.of(1, 1, 10).heavy.slots, AdmissionGate.of(1, 1, 10).heavy.per_identity) == (1, 1)


# -- through the app -----------------------------------------------------------------------------


class _Held(EmbeddedStore):
    """Every range read and period read waits for `release` (a report of the whole store's life, as slow as one
    likes)."""

    release = threading.Event()
    reads_started = 0

    def _hold(self) -> None:
        type(self).reads_started += 1
        type(self).release.wait(30)

    def query_range(self, query: RangeQuery) -> list[Series]:
        self._hold()
        return super().query_range(query)

    def period(self, start: float, end: float) -> list[WorkloadPeriod]:
        self._hold()
        return super().period(start, end)


@pytest.fixture
def held(tmp_path: Path) -> Iterator[_Held]:
    populate(tmp_path / "gpuwm.db").close()
    _Held.release, _Held.reads_started = threading.Event(), 0
    opened = _Held(tmp_path / "gpuwm.db")
    yield opened
    _Held.release.set()
    opened.close()


class _Users:
    """auth=kubernetes without a Kubernetes API: each token is a user of its name, who may read everything."""

    async def authenticate(self, token: str | None) -> User:
        from gpuwm.api.auth import AuthError

        if not token:
            raise AuthError(401, "missing bearer token")
        return User(username=token)

    async def allowed(self, user: User, namespace: str | None) -> bool:
        return True

    async def allowed_path(self, user: User, path: str) -> bool:
        return True


def _as(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_the_probes_never_wait_behind_queries(held: _Held) -> None:
    """Reports hold every slot and every store thread the queries have: the probes and the scrape still answer."""
    settings = Settings(auth="kubernetes", api_max_concurrent_queries=4, api_max_concurrent_queries_per_user=4,
                        api_query_queue_seconds=30)
    app = create_app(held, settings, authorizer=_Users())
    context: Any = app.state.context
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
        reports = [asyncio.create_task(http.get("/api/v1/report", params={"start": "0", "end": "2000"},
                                                headers=_as("mallory"))) for _ in range(12)]
        while _Held.reads_started < 4:
            await asyncio.sleep(0.01)
        assert held.concurrent_reads == 4 and context.gate.queries.held == {"mallory": 4}
        for path in ("/readyz", "/healthz", "/metrics"):
            answer = await asyncio.wait_for(http.get(path, headers=_as("prometheus")), 10)
            assert answer.status_code == 200, (path, answer.text)
        _Held.release.set()
        assert [answer.status_code for answer in await asyncio.gather(*reports)] == [200] * 12


async def test_reports_wait_their_turn_and_another_user_goes_first(held: _Held) -> None:
    settings = Settings(auth="kubernetes", api_max_concurrent_queries=4, api_max_concurrent_queries_per_user=2,
                        api_query_queue_seconds=2)
    app = create_app(held, settings, authorizer=_Users())
    period = {"start": "0", "end": "2000"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
        reports = [asyncio.create_task(http.get("/api/v1/report", params=period, headers=_as("mallory")))
                   for _ in range(12)]
        while _Held.reads_started < 2:
            await asyncio.sleep(0.01)
        context: Any = app.state.context
        assert context.gate.queries.held == {"mallory": 2}  # her other ten wait
        # another user's query is answered while hers wait
        other = await asyncio.wait_for(http.get("/api/v1/workloads", headers=_as("alice")), 10)
        assert other.status_code == 200
        deadline = time.monotonic() + 20
        while sum(task.done() for task in reports) < 10 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        refused = [task.result() for task in reports if task.done()]  # hers past the queue's 2 s
        assert [answer.status_code for answer in refused] == [429] * 10
        assert int(refused[0].headers["retry-after"]) >= 1 and "apiMaxConcurrentQueries" in refused[0].json()["message"]
        _Held.release.set()
        answered = await asyncio.gather(*[task for task in reports if not task.done()])
        assert [answer.status_code for answer in answered] == [200, 200]
    assert context.gate.queries.held_total == 0 and context.gate.queries.waiting == 0
