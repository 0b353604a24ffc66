"""How big and how many time-series answers the API gives at once.

One cluster-wide range query of every metric by GPU over years could hold hundreds of millions
of points; read into Python and encoded as JSON that is gigabytes, in the controller's own process
(which also runs kopf). So the size of an answer is checked before the store is read (400, naming
the limit and how to narrow the query), and only a few heavy answers are built at once (the admission
gate's `heavy` pool: the rest wait their turn, 429 with Retry-After past the queue's time): the
process's memory is bounded by about `heavy slots x max_points_per_response` points, whatever arrives.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from gpuwm.api.admission import SlotPool, current_identity
from gpuwm.api.params import BadParameter
from gpuwm.store import RangeQuery, Series

#: a query over this share of the per-answer limit is heavy: it takes one of the few slots
HEAVY_SHARE = 1 / 20


class QueryLimits:
    """The per-answer point limit and the pool of heavy answers' slots."""

    def __init__(self, max_points_per_response: int, heavy: SlotPool) -> None:
        self.max_points = max_points_per_response
        self.heavy = heavy
        self.heavy_points = max(1, int(max_points_per_response * HEAVY_SHARE))

    def estimate(self, query: RangeQuery, series_count: int | None) -> int:
        """Points of the answer: series x points per series (with an unknown breakdown, at least one each)."""
        per_series = int((query.end - query.start) // query.step_seconds) + 1
        return per_series * (series_count if series_count is not None else len(query.metrics))

    def check_size(self, points: int) -> None:
        if points > self.max_points:
            raise BadParameter(
                "step",
                f"the answer would hold {points} points (series x points per series), over the limit of "
                f"{self.max_points} (apiMaxPointsPerResponse); use a coarser step, a shorter start..end, "
                "fewer metric= or no by=",
            )

    @contextlib.asynccontextmanager
    async def admit(self, query: RangeQuery, series_count: int | None) -> AsyncIterator[None]:
        """Refuse an oversized query; hold a heavy slot (waiting for one) while a heavy one is read and encoded."""
        points = self.estimate(query, series_count)
        self.check_size(points)
        if points > self.heavy_points or series_count is None:
            async with self.heavy.holding(current_identity.get()):
                yield
        else:
            yield

    def check_answer(self, series: list[Series]) -> None:
        """After a read whose series count was unknown (a breakdown on Prometheus): refuse before encoding."""
        self.check_size(sum(len(one.points) for one in series))
