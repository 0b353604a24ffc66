"""Roll-up tiers of the embedded store: `STEP:KEEP`, finest first (e.g. 15s:2d, 5m:30d)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuwm.config import parse_duration_seconds


@dataclass(frozen=True)
class Tier:
    """Points every `step_seconds`, kept for `keep_seconds` after the latest data."""

    step_seconds: int
    keep_seconds: float

    @property
    def name(self) -> str:
        """`STEP:KEEP` as `--store-rollups` spells it (15s:2d)."""
        return f"{duration_text(self.step_seconds)}:{duration_text(self.keep_seconds)}"


def duration_text(seconds: float) -> str:
    """Seconds in the largest unit that divides them: 15s, 5m, 2d (a fraction of a second as a number)."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def parse_tiers(specs: Sequence[str]) -> list[Tier]:
    """Parse and check `--store-rollups`; the error names the option and the entry at fault."""
    if not specs:
        raise ValueError("--store-rollups: needs at least one STEP:KEEP tier, e.g. 15s:2d,5m:30d")
    tiers: list[Tier] = []
    for spec in specs:
        step_text, separator, keep_text = spec.partition(":")
        if not separator:
            raise ValueError(f"--store-rollups: {spec!r} is not STEP:KEEP (e.g. 15s:2d)")
        try:
            step = parse_duration_seconds(step_text)
            keep = parse_duration_seconds(keep_text)
        except ValueError as error:
            raise ValueError(f"--store-rollups: {spec!r}: {error}") from None
        if step < 1 or step != int(step):
            raise ValueError(f"--store-rollups: {spec!r}: the step must be a whole number of seconds >= 1")
        if keep < step:
            raise ValueError(f"--store-rollups: {spec!r}: KEEP must be at least one STEP")
        tier = Tier(step_seconds=int(step), keep_seconds=keep)
        if tiers:
            finer = tiers[-1]
            if tier.step_seconds <= finer.step_seconds or tier.step_seconds % finer.step_seconds:
                raise ValueError(
                    f"--store-rollups: {spec!r}: each step must be a larger multiple of the previous one "
                    f"({finer.step_seconds}s)"
                )
            if tier.keep_seconds <= finer.keep_seconds:
                raise ValueError(f"--store-rollups: {spec!r}: each KEEP must be longer than the previous one")
        tiers.append(tier)
    return tiers
