"""The one way into the store for every query the API answers: bounded at once, fair between users.

A query (a list, a time series, a report, its CSV) takes a slot of the process's `queries` pool for as
long as its route runs; a heavy time-series answer also takes one of the fewer `heavy` slots while it
is read and encoded (its points are the memory the process holds). A pool bounds how many slots are
held at once and how many one identity (the user its token names) holds; a query past either bound
waits, and waiting ones are served in turn: the user with the fewest running first, of those the one
served longest ago, then in arrival order, so no user's burst keeps another out. One that has waited
`queue_seconds`, or that finds its user's queue full, is answered 429 with Retry-After.

The probes and Prometheus' `/metrics` never come here: they read the store on threads of their own
(`ApiContext.aside`), so no number of queries can make the kubelet take the API out of its Service.
All of it runs on the event loop's thread: no locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import math
from collections import Counter, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from gpuwm.api.http import TooBusy

#: a user may have this many times its slots waiting; more are refused at once (a burst cannot fill memory
#: with waiting requests, nor push other users' turns back)
WAITING_PER_SLOT = 8
#: Retry-After of a refused query: slots come free as queries finish, so soon is worth a try
RETRY_AFTER_SECONDS = 2

#: the identity whose query the current request is (set once it is admitted): its heavy answers are
#: counted against the same user
current_identity: contextvars.ContextVar[str] = contextvars.ContextVar("gpuwm_api_identity", default="")


@dataclass
class _Waiter:
    identity: str
    turn: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class SlotPool:
    """At most `slots` held at once, at most `per_identity` of them by one identity; a fair queue past that."""

    def __init__(self, name: str, slots: int, per_identity: int, queue_seconds: float) -> None:
        self.name = name
        self.slots = max(1, slots)
        self.per_identity = max(1, min(per_identity, self.slots))
        self.queue_seconds = queue_seconds
        self.held: Counter[str] = Counter()
        self._waiting: deque[_Waiter] = deque()
        # when each identity holding or waiting was last given a slot (a count of grants): of users holding
        # as many, the one served longest ago goes first, so turns go round
        self._served_at: dict[str, int] = {}
        self._grants = 0

    @property
    def held_total(self) -> int:
        return sum(self.held.values())

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _may_hold(self, identity: str) -> bool:
        return self.held_total < self.slots and self.held[identity] < self.per_identity

    async def acquire(self, identity: str) -> None:
        """Hold a slot for `identity`, waiting for its turn up to `queue_seconds`; TooBusy past that."""
        # every waiter is one that may not hold a slot now (each release hands slots on at once), so one that
        # may is not passing anyone
        if self._may_hold(identity):
            self._grant(identity)
            return
        if sum(1 for each in self._waiting if each.identity == identity) >= WAITING_PER_SLOT * self.per_identity:
            raise self._refusal("its queue is full")
        waiter = _Waiter(identity)
        self._waiting.append(waiter)
        try:
            async with asyncio.timeout(self.queue_seconds):
                await waiter.turn
        except TimeoutError:
            if self._handed(waiter):  # its turn came as the time ran out: it holds the slot
                return
            self._leave_queue(waiter)
            raise self._refusal(f"it waited {self.queue_seconds:g} s") from None
        except asyncio.CancelledError:  # the client went away
            if self._handed(waiter):
                self.release(identity)
            else:
                self._leave_queue(waiter)
            raise

    @staticmethod
    def _handed(waiter: _Waiter) -> bool:
        return waiter.turn.done() and not waiter.turn.cancelled()

    def _grant(self, identity: str) -> None:
        self.held[identity] += 1
        self._grants += 1
        self._served_at[identity] = self._grants

    def release(self, identity: str) -> None:
        self.held[identity] -= 1
        if self.held[identity] <= 0:
            del self.held[identity]
            self._forget_if_idle(identity)
        self._hand_on()

    def _leave_queue(self, waiter: _Waiter) -> None:
        self._waiting.remove(waiter)
        self._forget_if_idle(waiter.identity)

    def _forget_if_idle(self, identity: str) -> None:
        """Keep `_served_at` to the identities holding or waiting: it does not grow with every user ever seen."""
        if identity not in self.held and not any(each.identity == identity for each in self._waiting):
            self._served_at.pop(identity, None)

    def _hand_on(self) -> None:
        """Give free slots to the waiters that may hold one: the identity holding the fewest first, of those
        the one served longest ago, then the earliest to arrive."""
        while self._waiting and self.held_total < self.slots:
            eligible = [each for each in self._waiting if self.held[each.identity] < self.per_identity]
            if not eligible:
                return
            # min keeps the earliest of equals
            chosen = min(eligible, key=lambda each: (self.held[each.identity], self._served_at.get(each.identity, 0)))
            self._waiting.remove(chosen)
            self._grant(chosen.identity)
            chosen.turn.set_result(None)

    @contextlib.asynccontextmanager
    async def holding(self, identity: str) -> AsyncIterator[None]:
        await self.acquire(identity)
        try:
            yield
        finally:
            self.release(identity)

    def _refusal(self, why: str) -> TooBusy:
        return TooBusy(
            f"the API is answering as many {self.name} as it may at once ({self.slots}, {self.per_identity} per "
            f"user: apiMaxConcurrentQueries, apiMaxConcurrentQueriesPerUser) and this one got no turn: {why}; "
            "retry shortly, or ask for less at once",
            retry_after_seconds=RETRY_AFTER_SECONDS,
        )


@dataclass
class AdmissionGate:
    """The process's two pools: every query's, and the heavy time-series answers' within them."""

    queries: SlotPool
    heavy: SlotPool

    @classmethod
    def of(cls, slots: int, slots_per_user: int, queue_seconds: float) -> AdmissionGate:
        """`slots` queries at once, `slots_per_user` of them per user; half of them at most (rounded up) heavy,
        and of those one user holds all but one where there are several."""
        heavy_slots = math.ceil(max(1, slots) / 2)
        return cls(
            queries=SlotPool("queries", slots, slots_per_user, queue_seconds),
            heavy=SlotPool(
                "large time-series queries", heavy_slots, min(slots_per_user, max(1, heavy_slots - 1)), queue_seconds
            ),
        )
