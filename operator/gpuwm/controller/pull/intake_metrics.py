"""The controller's own counters of what it refused from the agents, as Prometheus series.

`gpuwm_controller_rejected_samples_total{reason}` counts samples dropped from agents' snapshots
(`not-finite`: NaN or ±Infinity in a number), `gpuwm_controller_rejected_snapshots_total{reason}`
whole snapshots (`wrong-node`: an agent that answered for another node than the one pulled;
`wrong-format`: one that answered in another form than the columns the controller reads).
A rising count says an agent sends figures that cannot be used, and its GPUs' time goes unmonitored
meanwhile. Read at scrape time from the puller's counters (no state of its own), like the API's
`WorkloadMetricsCollector`; register it on the registry the controller's `/metrics` serves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuwm.accounting import Engine
from gpuwm.controller.pull.agents import NOT_FINITE, WRONG_FORMAT, WRONG_NODE, AgentPuller

#: the reasons always exported (at 0 before any), so an alert on a rate has a series from the start
_SAMPLE_REASONS = (NOT_FINITE,)
_SNAPSHOT_REASONS = (WRONG_FORMAT, WRONG_NODE)


class IntakeCollector(Collector):
    """Exports `puller`'s rejection counters; `puller` may be a callable returning the current one (or None)."""

    def __init__(self, puller: AgentPuller | Callable[[], AgentPuller | None]) -> None:
        self._puller = puller

    def collect(self) -> Iterator[Metric]:
        puller = self._puller if isinstance(self._puller, AgentPuller) else self._puller()
        samples: Mapping[str, int] = {} if puller is None else puller.rejected_samples
        snapshots: Mapping[str, int] = {} if puller is None else puller.rejected_snapshots
        yield _counter("gpuwm_controller_rejected_samples",
                       "Samples dropped from agents' snapshots, by reason (not-finite: NaN or infinity in a number).",
                       samples, _SAMPLE_REASONS)
        yield _counter("gpuwm_controller_rejected_snapshots",
                       "Agents' snapshots dropped whole, by reason (wrong-node: it named another node than pulled; "
                       "wrong-format: it answered in another form than columns).",
                       snapshots, _SNAPSHOT_REASONS)


def _counter(name: str, documentation: str, counts: Mapping[str, int], reasons: tuple[str, ...]) -> Metric:
    family = CounterMetricFamily(name, documentation, labels=["reason"])
    for reason in sorted(set(reasons) | set(counts)):
        family.add_metric([reason], float(counts.get(reason, 0)))
    return family


class EngineCollector(Collector):
    """The engine's counters of its input: samples whose busy GPU the processes seen could not explain
    (DESIGN §3's attribution rule: their holders took the device's figure) and samples dropped as too late.

    A rising `gpuwm_controller_unattributed_samples_total` says that agents do not see the processes
    on busy GPUs (an agent without hostPID, MIG instances hiding them): figures still count the
    activity, but a shared GPU's holders can no longer be told apart.
    """

    def __init__(self, engine: Engine | Callable[[], Engine | None]) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        engine = self._engine if isinstance(self._engine, Engine) else self._engine()
        yield CounterMetricFamily(
            "gpuwm_controller_unattributed_samples",
            "Samples of a busy GPU whose holders' processes could not explain it (the device's figure was used).",
            value=float(0 if engine is None else engine.unattributed_samples),
        )
        yield CounterMetricFamily(
            "gpuwm_controller_late_samples_dropped", "Samples older than the late-event window, dropped.",
            value=float(0 if engine is None else engine.late_samples_dropped),
        )
