"""The idle policies' and the cost's Prometheus series, read at scrape time from the room.

In OpenCost's spirit: cumulative cost as `_total` counters a `rate()` or `increase()` turns into money per
period, and the price of what is held now as gauges. `gpuwm_idle_policy_warning` is 1 for each workload
a policy has warned and that is still idle: the series an alert routes to the workload's owners.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuwm.controller.policy.room import PolicyRoom

_WORKLOAD_LABELS = ["namespace", "workload", "workload_uid", "kind", "project", "currency"]


class PolicyCollector(Collector):
    """Exports the room's counters, warnings and costs; `room` may be a callable returning it (or None)."""

    def __init__(self, room: PolicyRoom | Callable[[], PolicyRoom | None]) -> None:
        self._room = room

    def collect(self) -> Iterator[Metric]:
        room = self._room if isinstance(self._room, PolicyRoom) else self._room()
        if room is None:
            return
        actions = CounterMetricFamily("gpuwm_idle_policy_actions", "Idle-policy steps, by policy, action and result "
                                      "(Succeeded, Failed, Skipped, DryRun).", labels=["policy", "action", "result"])
        for (policy, action, result), count in sorted(room.counters.items()):
            actions.add_metric([policy, action, result], float(count))
        yield actions
        warning = GaugeMetricFamily("gpuwm_idle_policy_warning", "1 for a workload a policy warned and that is still "
                                    "idle.", labels=["namespace", "workload", "kind", "project", "policy"])
        for policy, uid in sorted(room.warned):
            identity = room.identity.get(uid)
            if identity is not None:
                warning.add_metric([*identity, policy], 1.0)
        yield warning
        if room.meter.enabled:
            yield from _cost_families(room)


def _cost_families(room: PolicyRoom) -> Iterator[Metric]:
    currency = room.meter.currency
    families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {
        "cost": CounterMetricFamily("gpuwm_workload_cost", "GPU-seconds priced, plus energy, over the workload's "
                                    "life.", labels=_WORKLOAD_LABELS),
        "idle": CounterMetricFamily("gpuwm_workload_idle_cost", "Idle GPU-seconds priced: GPUs held and not used.",
                                    labels=_WORKLOAD_LABELS),
        "energy": CounterMetricFamily("gpuwm_workload_energy_cost", "GPU energy priced by the kWh.",
                                      labels=_WORKLOAD_LABELS),
        "hourly": GaugeMetricFamily("gpuwm_workload_cost_per_hour", "Price of the GPU units held now, per hour.",
                                    labels=_WORKLOAD_LABELS),
        "rate": GaugeMetricFamily("gpuwm_workload_gpu_hourly_cost", "Its price of one GPU-hour (a whole GPU's; a "
                                  "slice or replica pays its units' share).", labels=_WORKLOAD_LABELS),
    }
    for uid, cost in sorted(room.costs.items()):
        identity = room.identity.get(uid)
        if identity is None:
            continue
        namespace, name, kind, project_name = identity
        # a reused name's runs are series of their own (a period report reads each run's price by its uid)
        labels = [namespace, name, uid, kind, project_name, currency]
        for key, value in (("cost", cost.cost), ("idle", cost.idle_cost), ("energy", cost.energy_cost),
                           ("hourly", cost.cost_per_hour), ("rate", cost.price_per_gpu_hour)):
            if value is not None:
                families[key].add_metric(labels, value)
    yield from families.values()
    project: dict[str, CounterMetricFamily | GaugeMetricFamily] = {
        "cost": CounterMetricFamily("gpuwm_project_cost", "Sum of its workloads' cost.", labels=["project", "currency"]),
        "idle": CounterMetricFamily("gpuwm_project_idle_cost", "Sum of its workloads' idle cost: GPUs held, not used.",
                                    labels=["project", "currency"]),
        "hourly": GaugeMetricFamily("gpuwm_project_cost_per_hour", "Price of the GPU units it holds now, per hour.",
                                    labels=["project", "currency"]),
        "idle_hourly": GaugeMetricFamily("gpuwm_project_idle_cost_per_hour", "Price per hour of the units it holds "
                                         "whose latest sample was inactive.", labels=["project", "currency"]),
    }
    for name, total in sorted(room.project_cost.items()):
        for key, value in (("cost", total.cost), ("idle", total.idle_cost), ("hourly", total.cost_per_hour),
                           ("idle_hourly", total.idle_cost_per_hour)):
            if value is not None:
                project[key].add_metric([name, currency], value)
    yield from project.values()
