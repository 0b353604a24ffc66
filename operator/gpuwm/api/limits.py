"""How big and how many time-series answers the API gives at once.

One cluster-wide range query of every metric by GPU over years could hold hundreds of millions
of points; read into Python and encoded as JSON that is gigabytes, in the controller's own process
(which also runs kopf). So the size of an answer is checked before the store is read (400, naming
the limit and how to narrow the query), and only a few heavy answers are built at once (429 with
Retry-After past them): the process's memory is bounded by about
`max_concurrent_queries x max_points_per_response` points, whatever arrives.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from gpuwm.api.http import TooBusy
from gpuwm.api.params import BadParameter
from gpuwm.store import RangeQuery, Series

#: a query over this share of the per-answer limit is heavy: it takes one of the few slots
HEAVY_SHARE = 1 / 20


class QueryLimits:
    """The per-answer point limit and the slots of heavy queries (one event loop: no lock needed)."""

    def __init__(self, max_points_per_response: int, max_concurrent_queries: int) -> None:
        self.max_points = max_points_per_response
        self.max_heavy = max_concurrent_queries
        self.heavy_points = max(1, int(max_points_per_response * HEAVY_SHARE))
        self.heavy_now = 0

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

    @contextlib.contextmanager
    def admit(self, query: RangeQuery, series_count: int | None) -> Iterator[None]:
        """Refuse an oversized query; hold a heavy slot while a heavy one is read and encoded."""
        points = self.estimate(query, series_count)
        self.check_size(points)
        heavy = points > self.heavy_points or series_count is None
        if heavy and self.heavy_now >= self.max_heavy:
            raise TooBusy(
                f"{self.heavy_now} large queries are being answered (apiMaxConcurrentQueries {self.max_heavy}); "
                "retry shortly, or ask for fewer points",
                retry_after_seconds=2,
            )
        if heavy:
            self.heavy_now += 1
        try:
            yield
        finally:
            if heavy:
                self.heavy_now -= 1

    def check_answer(self, series: list[Series]) -> None:
        """After a read whose series count was unknown (a breakdown on Prometheus): refuse before encoding."""
        self.check_size(sum(len(one.points) for one in series))
