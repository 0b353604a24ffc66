"""The feed's merge request (`MergeRequest`, what the controller asks) and the agent's merging of polls.

Runs of a device's 1 Hz polls go as one sample each, with nothing lost that the engine counts.

Parsing, accounting and keeping every poll of every device costs the controller CPU and memory
in proportion to the fleet, yet most consecutive polls say the same thing to the accounting:
the GPU busy (or idle) for every holder, second after second. The controller asks
(`/v1/snapshot?merge_seconds=S&merge_threshold_percent=P&merge_gap_seconds=G`) and the agent
sends each such run as one sample at the run's last poll, carrying `merged_seconds` (the run's
last time minus its first) and the run's time-weighted means, the energy counter of its last poll.

A poll joins the run before it only where that changes none of allocated, active, idle and
unmonitored GPU-seconds, lastActiveTime, idleSeconds, idleGpus and a GPU's energy:

- the same device fields (`gpuwm.feed.schema.DEVICE_FIELDS`), healthy, with `sm_percent` and no error;
- no more than G seconds after the poll before it, the run's first poll too (the engine
  judges a run by its first gap, `t - merged_seconds - previous t <= 3 x interval`, and a
  longer one there would make the whole run unmonitored); the run no longer than S;
- every holder active in every poll, or idle in every poll, whatever its share and however many
  hold the device (DESIGN §3's attribution rule: one holder gets the device's SM % over its
  share; several split by their processes, or get the device's SM % where the processes cannot
  explain a busy device): the device's SM % is >= P in every poll or 0 in every poll, and each
  pod's summed SM % (where there is per-process data) is >= P in every poll or 0 in every poll
  (a utilisation is an SM figure over a share, so a figure between 0 and P could fall either
  side and breaks the run); and, as that quotient is capped at 100, each busy figure x on the
  same side of 100/k in every poll for every k up to `EXACT_UP_TO_REPLICAS` (the same
  floor(100/x)), so that the capped figures' mean is the mean's capped figure for a holder of
  1/k of the device;
- the energy counter present in every poll (and the poll before the run) and never going
  backwards, or absent in every one of them.

Each device's first and last poll in an answer stay single: the first, because its own
interval starts before the answer (its weight is not known here); the last, so that a
workload's `current` utilisation and `idleGpus` still read the latest poll. So a 15 s pull
at 1 Hz carries 3 samples per device instead of 15. What merging does change: the 1m/5m/1h
windows see a run's mean spread evenly over the run, so a window edge that falls inside a
run takes a share of the mean instead of the polls it cuts; and where a holder's allocation
starts or ends inside a run, its piece of the run gets the run's mean utilisation and power
(its lifetime means and its share of the energy), not those of the polls in that piece.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from gpuwm.feed.schema import device_key

#: figures merged as time-weighted means (over the polls that report them)
MEAN_FIELDS = (
    "sm_percent", "memory_used_bytes", "memory_activity_percent", "power_watts", "temperature_celsius",
    "sm_clock_mhz", "memory_clock_mhz", "pcie_rx_bytes_per_second", "pcie_tx_bytes_per_second",
)


#: shares of a device down to 1/this (time-sliced replicas) keep merged figures exact (see `_cap_side`): what a
#: merge request asks unless the controller knows a node's devices are held whole (`MergeRequest.exact_replicas`)
EXACT_UP_TO_REPLICAS = 16


def _cap_side(percent: float, exact_replicas: int) -> int:
    """Which k = 1, 2, ... make `percent` x k reach the cap of 100 (those up to the result), bounded.

    A holder of 1/k of a device gets an SM figure x k, capped at 100: polls whose figures share
    this are all capped, or all not, for every k up to `exact_replicas`, so their mean stays
    what the engine would count poll by poll. With `exact_replicas` 1 (every holder holds its
    whole device) there is no cap to reach: x <= 100.
    """
    return min(exact_replicas, math.floor(100.0 / percent)) if percent > 0 else exact_replicas


@dataclass(frozen=True)
class MergeRequest:
    """What the controller asks of a snapshot's merging: its idle threshold, its gap (3 x interval), a run's span,
    and the smallest share of a device (1/`exact_replicas`) whose capped figures must stay exact.

    `exact_replicas` 1 is for a node whose every device is held whole (the controller knows it from
    its pods and their holders): polls then merge across the cap sides (x < 50 and x >= 50 are one
    run) that only a holder of part of a device can tell apart. An agent that does not know the
    parameter keeps every share down to 1/`EXACT_UP_TO_REPLICAS` exact, which is always right.
    """

    span_seconds: float
    threshold_percent: float = 1.0
    gap_seconds: float = 3.0
    exact_replicas: int = EXACT_UP_TO_REPLICAS

    def query(self) -> str:
        """The query parameters that ask for this (`&`-joined, leading `&`)."""
        exact = "" if self.exact_replicas == EXACT_UP_TO_REPLICAS else f"&merge_exact_replicas={self.exact_replicas}"
        return (f"&merge_seconds={self.span_seconds!r}&merge_threshold_percent={self.threshold_percent!r}"
                f"&merge_gap_seconds={self.gap_seconds!r}{exact}")


def merge_request(query: Mapping[str, Sequence[str]]) -> MergeRequest | None:
    """The merge asked for in a parsed query string (`parse_qs`), None for none; ValueError naming a bad parameter."""
    values: dict[str, float] = {}
    for name, default, highest in (("merge_seconds", 0.0, math.inf), ("merge_threshold_percent", 1.0, 100.0),
                                   ("merge_gap_seconds", 3.0, math.inf)):
        given = query.get(name)
        if not given:
            values[name] = default
            continue
        try:
            value = float(given[-1])
        except ValueError:
            value = math.nan
        if not 0.0 <= value <= highest or math.isinf(value):
            limit = f"<= {highest:g}" if highest < math.inf else "finite"
            raise ValueError(f"{name}={given[-1]!r}: expected a number >= 0 and {limit}")
        values[name] = value
    if values["merge_seconds"] <= 0:
        return None
    exact_replicas = EXACT_UP_TO_REPLICAS
    given = query.get("merge_exact_replicas")
    if given:
        try:
            exact_replicas = int(given[-1])
        except ValueError:
            exact_replicas = 0
        if not 1 <= exact_replicas <= EXACT_UP_TO_REPLICAS:
            raise ValueError(f"merge_exact_replicas={given[-1]!r}: expected a whole number from 1 to "
                             f"{EXACT_UP_TO_REPLICAS}")
    return MergeRequest(values["merge_seconds"], values["merge_threshold_percent"], values["merge_gap_seconds"],
                        exact_replicas)


def _pod_sm(sample: Mapping[str, Any]) -> dict[str, float] | None:
    """SM % per pod uid as the engine reads it (`sample_values`): None without per-process data."""
    processes = sample.get("processes")
    if processes is None:
        return None
    with_sm = [process for process in processes if process.get("sm_percent") is not None]
    if processes and not with_sm:
        return None
    by_pod: dict[str, float] = {}
    for process in with_sm:
        pod_uid = process.get("pod_uid")
        if pod_uid is not None:
            by_pod[pod_uid] = by_pod.get(pod_uid, 0.0) + float(process["sm_percent"])
    return by_pod


def _activity(sample: Mapping[str, Any], threshold_percent: float, exact_replicas: int) -> tuple[Any, ...] | None:
    """What every holder's active/idle verdict depends on, or None when the poll cannot be merged."""
    if sample.get("healthy", True) is not True or sample.get("error") is not None or sample.get("merged_seconds"):
        return None
    sm = sample.get("sm_percent")
    if sm is None:
        return None
    device_busy = float(sm) >= threshold_percent
    if not device_busy and sm != 0.0:
        return None  # between 0 and the threshold: over a small share (one holder of a replica) it may be active
    device = (device_busy, _cap_side(float(sm), exact_replicas) if device_busy else 0)
    pod_sm = _pod_sm(sample)
    if pod_sm is None:
        return (device, None)
    active = []
    for pod_uid, value in pod_sm.items():
        if value >= threshold_percent:
            active.append((pod_uid, _cap_side(value, exact_replicas)))
        elif value != 0.0:
            return None  # between 0 and the threshold: over a small share it may be active
    # both: a busy device whose holders' processes explain none of it is every holder's
    return (device, frozenset(active))


def _counter_continues(previous: Mapping[str, Any], sample: Mapping[str, Any]) -> bool:
    """Whether the energy counter goes on from `previous` to `sample`: present in both and not back, or in neither.

    Between a run's first poll and its predecessor too: the engine takes the run's energy as
    its last counter minus the counter before the run, which equals the polls' own deltas
    only then.
    """
    before, now = previous.get("energy_joules"), sample.get("energy_joules")
    return (before is None) == (now is None) and (now is None or now >= before)


def _merged(run: Sequence[Mapping[str, Any]], weights: Sequence[float]) -> dict[str, Any]:
    """One sample for a run of polls: the last poll's time, seq and counter; time-weighted means of the figures."""
    last = run[-1]
    sample = dict(last)
    sample["merged_seconds"] = last["t"] - run[0]["t"]
    for name in MEAN_FIELDS:
        total = weight_sum = 0.0
        for poll, weight in zip(run, weights, strict=True):
            value = poll.get(name)
            if value is not None:
                total += weight * value
                weight_sum += weight
        sample[name] = total / weight_sum if weight_sum > 0 else None
    if last.get("processes") is not None:
        sample["processes"] = _merged_processes(run, weights)
    return sample


def _merged_processes(run: Sequence[Mapping[str, Any]], weights: Sequence[float]) -> list[dict[str, Any]]:
    """Each process of the run once (by pid, pod and container), its SM and memory time-weighted over the whole run.

    A process missing from a poll counts 0 there, so a pod's summed SM stays the mean of its
    per-poll sums: the figure the engine compares with the threshold.
    """
    span = sum(weights)
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    sums: dict[tuple[Any, ...], list[float | None]] = {}
    for poll, weight in zip(run, weights, strict=True):
        for process in poll.get("processes") or ():
            key = (process.get("pid"), process.get("pod_uid"), process.get("container"))
            if key not in merged:
                merged[key] = dict(process)
                sums[key] = [None, None]
            totals = sums[key]
            for position, name in enumerate(("sm_percent", "memory_used_bytes")):
                value = process.get(name)
                if value is not None:
                    totals[position] = (totals[position] or 0.0) + weight * value
    for key, process in merged.items():
        sm_total, memory_total = sums[key]
        process["sm_percent"] = None if sm_total is None else min(100.0, sm_total / span)
        process["memory_used_bytes"] = None if memory_total is None else memory_total / span
    return list(merged.values())


def _runs(polls: Sequence[Mapping[str, Any]], request: MergeRequest) -> list[list[int]]:
    """One device's polls (in time order) cut into runs of indexes; the first and the last poll each a run alone."""
    runs: list[list[int]] = [[0]]
    run_activity: tuple[Any, ...] | None = None
    for index in range(1, len(polls) - 1):
        poll = polls[index]
        activity = _activity(poll, request.threshold_percent, request.exact_replicas)
        if activity is not None:  # the device fields too: a run is one device as it was
            activity = (*activity, device_key(poll))
        previous = polls[index - 1]
        joins = poll["t"] - previous["t"] <= request.gap_seconds and _counter_continues(previous, poll)
        run = runs[-1]
        if (len(runs) > 1 and joins and activity is not None and activity == run_activity
                and poll["t"] - polls[run[0]]["t"] <= request.span_seconds):
            run.append(index)
        else:
            runs.append([index])
            # None: nothing joins it. Nor may a run start at a poll after a gap (only that poll's own interval is
            # unmonitored, where the engine would judge the whole run by it) or whose counter went back
            run_activity = activity if joins else None
    runs.append([len(polls) - 1])
    return runs


def merge_polls(samples: Sequence[Mapping[str, Any]], request: MergeRequest) -> list[Mapping[str, Any]]:
    """The samples of one snapshot answer (JSON objects in seq order) with mergeable runs merged (module docstring).

    A run of one poll is passed on as it was; the result keeps seq order (a merged sample sits
    where its last poll was).
    """
    by_device: dict[str, list[int]] = {}
    for position, sample in enumerate(samples):
        by_device.setdefault(sample["uuid"], []).append(position)
    placed: list[tuple[int, Mapping[str, Any]]] = []
    for positions in by_device.values():
        polls = [samples[position] for position in positions]
        if len(polls) < 4 or any(later["t"] <= earlier["t"] for earlier, later in pairwise(polls)):
            placed.extend(zip(positions, polls, strict=True))
            continue
        for run in _runs(polls, request):
            if len(run) == 1:
                placed.append((positions[run[0]], polls[run[0]]))
            else:
                weights = [polls[index]["t"] - polls[index - 1]["t"] for index in run]
                placed.append((positions[run[-1]], _merged([polls[index] for index in run], weights)))
    placed.sort(key=lambda entry: entry[0])
    return [sample for _, sample in placed]
