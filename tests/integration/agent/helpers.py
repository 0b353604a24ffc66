"""Shared pieces of the agent integration tests: the scenario, the pods, and process helpers."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tests.fakenvml import fake_nvml_env
from tests.fakenvml.podresources_server import FakePod

T = TypeVar("T")

UID_TRAIN = "11111111-0000-4000-8000-000000000001"
UID_NOTEBOOK = "22222222-0000-4000-8000-000000000002"
UID_INFER_A = "33333333-0000-4000-8000-00000000000a"
UID_INFER_B = "33333333-0000-4000-8000-00000000000b"
UID_MIG = "55555555-0000-4000-8000-000000000005"

SCENARIO = """
driver version=550.54.15
gpu uuid=GPU-1111 name=NVIDIA_H100_80GB_HBM3 memory_used_mib=2048 power_mw=350000 power_limit_mw=700000 energy_mj=5000000 temperature_c=61 sm_clock_mhz=1980 mem_clock_mhz=2619 pcie_rx_kbs=1000 pcie_tx_kbs=2000 util=0/100 instant_util=7 mem_util=30
gpu uuid=GPU-2222 memory_used_mib=800 power_mw=90000 util=90 samples=0 instant_util=3 mem_util=1
gpu uuid=GPU-3333 memory_used_mib=300 power_mw=200000 util=40 mem_util=10
gpu uuid=GPU-4444 power_mw=150000 energy_mj=100 util=25
mig parent=GPU-4444 uuid=MIG-5555 gi=2 ci=0 slices=3 memory_total_mib=40192 memory_used_mib=300 util=25
gpu uuid=GPU-6666 error=15
proc device=GPU-1111 pid=1001 used_mib=1500 sm=45
proc device=GPU-2222 pid=1002 used_mib=800 sm=0
proc device=GPU-3333 pid=1003 used_mib=100 sm=10
proc device=GPU-3333 pid=1004 used_mib=200 sm=30
proc device=MIG-5555 pid=1005 used_mib=300 sm=25
"""

PODS = [
    FakePod("team-a", "train-0", {"main": [("nvidia.com/gpu", ["GPU-1111"])]}),
    FakePod("team-b", "notebook", {"jupyter": [("nvidia.com/gpu", ["GPU-2222"])]}),
    FakePod("serving", "infer-a", {"server": [("nvidia.com/gpu.shared", ["GPU-3333::0"])]}),
    FakePod("serving", "infer-b", {"server": [("nvidia.com/gpu.shared", ["GPU-3333::1"])]}),
    FakePod("team-c", "mig-job", {"worker": [("nvidia.com/mig-3g.40gb", ["MIG-5555"])]}),
]
ALLOCATABLE = {"nvidia.com/gpu.shared": [f"GPU-3333::{i}" for i in range(4)], "nvidia.com/gpu": ["GPU-1111", "GPU-2222"]}
PIDS = {1001: UID_TRAIN, 1002: UID_NOTEBOOK, 1003: UID_INFER_A, 1004: UID_INFER_B, 1005: UID_MIG}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for(check: Callable[[], T | None], timeout_seconds: float = 20.0, what: str = "condition") -> T:
    deadline = time.monotonic() + timeout_seconds
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_seconds}s waiting for {what}")
        time.sleep(0.1)


def http_get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except OSError:
        return 0, b""


def agent_command(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "gpuwm.cli", "agent", *arguments]


def run_once(lib: Path | None, scenario: Path | None, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        agent_command("--once", "--node-name", "node-1", *arguments),
        env=fake_nvml_env(lib, scenario), capture_output=True, text=True, timeout=60,
    )


@dataclass
class RunningAgent:
    process: subprocess.Popen[str]
    url: str
    log_path: Path

    def get(self, path: str) -> tuple[int, bytes]:
        return http_get(self.url + path)

    def snapshot(self, since: int = 0) -> dict[str, Any]:
        status, body = self.get(f"/v1/snapshot?since={since}")
        assert status == 200, body
        result: dict[str, Any] = json.loads(body)
        return result

    def log(self) -> str:
        return self.log_path.read_text()


