"""PCIe throughput through the real pynvml binding: read on the first poll, then at most every 5 s (each read
blocks 20 ms in the driver, and in the fake), its figures kept in between."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuwm.agent.nvml import GAUGES_EVERY_SECONDS
from tests.fakenvml import write_scenario
from tests.integration.agent.helpers import RunningAgent, wait_for

pytestmark = pytest.mark.integration

SCENARIO = """
driver version=550.54.15
gpu uuid=GPU-1111 pcie_rx_kbs={rx} pcie_tx_kbs=3000 util=50
gpu uuid=GPU-4444 util=25
mig parent=GPU-4444 uuid=MIG-5555 gi=2 ci=0 slices=3 memory_total_mib=40192 util=25
"""


def _pcie(agent: RunningAgent, uuid: str) -> list[tuple[float, float | None, float | None]]:
    return [(s["t"], s["pcie_rx_bytes_per_second"], s["pcie_tx_bytes_per_second"])
            for s in agent.snapshot()["samples"] if s["uuid"] == uuid]


def test_the_reading_is_kept_between_reads(start_agent: Callable[..., RunningAgent], fake_nvml_lib: Path,
                                           tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path / "scenario.txt", SCENARIO.format(rx=1000))
    agent = start_agent(fake_nvml_lib, scenario, "--interval", "0.2")
    first_t = wait_for(lambda: _pcie(agent, "GPU-1111"), what="a first poll")[0][0]
    write_scenario(scenario, SCENARIO.format(rx=5000))
    changed_at = time.time()
    later = wait_for(lambda: [s for s in _pcie(agent, "GPU-1111") if s[1] == 5000 * 1024.0],
                     timeout_seconds=GAUGES_EVERY_SECONDS + 10, what="the next reading")
    samples = _pcie(agent, "GPU-1111")
    kept = [s for s in samples if s[0] < later[0][0]]
    # every poll before the next read repeats the first reading, though the link's rate changed meanwhile
    assert len(kept) >= 5 and {s[1:] for s in kept} == {(1000 * 1024.0, 3000 * 1024.0)}
    assert any(s[0] > changed_at for s in kept)
    assert later[0][0] - first_t >= GAUGES_EVERY_SECONDS - 0.5  # read again only once the period passed
    # a MIG instance has no PCIe figures of its own (its parent GPU's sample has them)
    assert {s[1:] for s in _pcie(agent, "MIG-5555")} == {(None, None)}
    assert {s[1:] for s in _pcie(agent, "GPU-4444")} != {(None, None)}
