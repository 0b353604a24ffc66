"""The engine state is saved in each of the first three cycles, then every `state_save_interval`.

A restart re-reads the agents from the saved positions, so the interval sets how much a restart
replays (and how often the ~55 MB state of an 8,000-GPU cluster is written), not what it loses.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwm.config import Settings
from gpuwm.controller.kube.client import KubeClient
from gpuwm.controller.runtime import ControllerRuntime

START = 1_790_000_000.0


async def _saved_cycles(save_interval: str, cycles: int, folder: Path) -> list[int]:
    """Which cycles (1-based, 15 s apart) saved the state."""
    clock = [START]
    settings = Settings(agents="static:n1=http://127.0.0.1:9", state_save_interval=save_interval)
    client = KubeClient("http://127.0.0.1:9")
    runtime = ControllerRuntime(settings, client, clock=lambda: clock[0])
    saved: list[int] = []
    real_save = runtime.save_in_background

    async def save(now: float) -> None:
        saved.append(runtime.cycles + 1)
        await real_save(now)

    runtime.save_in_background = save  # type: ignore[method-assign]
    runtime.state_path = folder / "gpuwm.db.engine.json"
    try:
        for _ in range(cycles):
            await runtime.cycle()
            clock[0] += 15.0
    finally:
        await runtime.puller.close()
        await client.close()
    return saved


@pytest.mark.parametrize(("save_interval", "expected"), [
    ("2m", [1, 2, 3, 11, 19]),  # the default: the third cycle's save at +30 s, then +150 s, +270 s
    ("60s", [1, 2, 3, 7, 11, 15, 19]),
    ("0", list(range(1, 21))),
])
async def test_saves_follow_the_setting(save_interval: str, expected: list[int], tmp_path: Path) -> None:
    assert await _saved_cycles(save_interval, 20, tmp_path) == expected
    assert (tmp_path / "gpuwm.db.engine.json").exists()


def test_the_default_is_two_minutes() -> None:
    assert Settings().state_save_interval == 120.0
