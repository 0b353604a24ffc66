"""The driver's buffered figures shared out among the polls they cover: pure arithmetic, no NVML.

The sampler reads the utilisation sample buffer and the energy counter less often than it polls
(`gpuwm.agent.nvml`): what a read returns covers every poll since the last one, and is split among
them here, by the samples' own timestamps (`interval_means`) or by each poll's power reading
(`spread_energy`, `carry_energy`).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate, pairwise


def interval_means(
    samples: Sequence[tuple[int, float]], bounds_us: Sequence[int]
) -> list[float | None]:
    """The mean of the samples (timestamp µs, value) in each interval (bounds[i-1], bounds[i]], in time order.

    An interval no sample falls in (polls faster than the driver samples) takes the first sample after
    it, whose own period covers it; None where there is none (the caller falls back to an instant figure).
    """
    ordered = sorted(samples)
    means: list[float | None] = []
    position = 0
    for end in bounds_us[1:]:
        total, count = 0.0, 0
        while position < len(ordered) and ordered[position][0] <= end:
            if ordered[position][0] > bounds_us[0]:
                total += ordered[position][1]
                count += 1
            position += 1
        if count:
            means.append(total / count)
        elif position < len(ordered):
            means.append(ordered[position][1])
        else:
            means.append(None)
    return means


def spread_energy(
    previous_mj: float | None, now_mj: float | None, times: Sequence[float], power_mw: Sequence[float | None],
    counter_floor_mj: float | None = None,
) -> list[float | None]:
    """The energy counter (mJ) at each of the polls `times[1:]`, from `previous_mj` at `times[0]` (the value the
    last poll handed over) and a reading of the counter, `now_mj`, at the last poll. The growth between them is
    spread by each interval's power × its length (by length alone where a power is missing), so the polls'
    differences add up to the counter's own.

    `counter_floor_mj`: the counter's previous reading, where `previous_mj` was carried forward from it by power
    (`carry_energy`). A reading below `previous_mj` but not below that floor means the power ran ahead of the
    counter: the polls hold `previous_mj` (no growth) until the counter passes it, so nothing is counted twice.
    Without an earlier value, or when the counter went below its floor (a driver reload), every poll gets the new one.
    """
    count = len(times) - 1
    if now_mj is None:
        return [None] * count
    if previous_mj is not None and counter_floor_mj is not None and counter_floor_mj <= now_mj < previous_mj:
        return [previous_mj] * count
    if previous_mj is None or now_mj < previous_mj or count <= 1:
        return [now_mj] * count
    lengths = [max(0.0, later - earlier) for earlier, later in pairwise(times)]
    weights = [length * power if power is not None and power > 0 else 0.0
               for length, power in zip(lengths, power_mw, strict=True)]
    if sum(weights) <= 0:
        weights = lengths if sum(lengths) > 0 else [1.0] * count
    total, growth = sum(weights), now_mj - previous_mj
    spread: list[float | None] = [previous_mj + growth * running / total for running in accumulate(weights)]
    spread[-1] = now_mj
    return spread


def carry_energy(previous_mj: float | None, times: Sequence[float], power_mw: Sequence[float | None]) -> list[float | None]:
    """The energy counter (mJ) at each of the polls `times[1:]` without reading it: `previous_mj` at `times[0]`
    carried forward by each interval's power × length (mW × s = mJ; nothing where a power is missing)."""
    if previous_mj is None:
        return [None] * (len(times) - 1)
    running, carried = previous_mj, list[float | None]()
    for (earlier, later), power in zip(pairwise(times), power_mw, strict=True):
        if power is not None and power > 0 and later > earlier:
            running += power * (later - earlier)
        carried.append(running)
    return carried
