"""`gpuwm agent --once` on the fake NVML library: real pynvml, real structs, real error codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuwm.feed import AgentDevice
from gpuwm.model import GpuSample
from tests.fakenvml import build_fake_nvml, write_scenario
from tests.fakenvml.podresources_server import PodResourcesServer
from tests.integration.agent.helpers import UID_INFER_A, UID_INFER_B, UID_MIG, UID_TRAIN, run_once

pytestmark = pytest.mark.integration


def _once(lib: Path, scenario: Path, *arguments: str) -> dict[str, Any]:
    result = run_once(lib, scenario, *arguments)
    assert result.returncode == 0, result.stderr
    snapshot: dict[str, Any] = json.loads(result.stdout)
    return snapshot


def test_once_reports_every_figure(
    fake_nvml_lib: Path, scenario: Path, fake_proc: Path, pod_resources: PodResourcesServer
) -> None:
    snapshot = _once(
        fake_nvml_lib, scenario, "--proc-root", str(fake_proc), "--pod-resources-socket", str(pod_resources.socket_path),
        "--idle-threshold-percent", "5",
    )
    assert snapshot["node"] == "node-1"
    samples = {s["uuid"]: GpuSample.model_validate(s) for s in snapshot["samples"]}
    assert set(samples) == {"GPU-1111", "GPU-2222", "GPU-3333", "GPU-4444", "MIG-5555", "GPU-6666"}
    assert [s["seq"] for s in snapshot["samples"]] == list(range(1, 7))
    assert snapshot["seq"] == 6
    # each record is exactly a replay-trace sample plus seq: one model for both
    assert all(set(record) == set(GpuSample.model_fields) for record in snapshot["samples"])

    gpu = samples["GPU-1111"]
    # utilisation from nvmlDeviceGetSamples (pattern 0/100) over the interval, not the instant value 7
    assert gpu.sm_percent is not None and 30.0 <= gpu.sm_percent <= 70.0
    assert gpu.memory_activity_percent == 30.0
    assert gpu.model == "NVIDIA H100 80GB HBM3" and gpu.index == 0 and gpu.healthy
    assert gpu.memory_used_bytes == 2048 * 1024**2
    assert gpu.memory_total_bytes == 81559 * 1024**2
    assert (gpu.power_watts, gpu.power_limit_watts, gpu.temperature_celsius) == (350.0, 700.0, 61.0)
    assert (gpu.sm_clock_mhz, gpu.memory_clock_mhz) == (1980.0, 2619.0)
    assert (gpu.pcie_rx_bytes_per_second, gpu.pcie_tx_bytes_per_second) == (1000 * 1024.0, 2000 * 1024.0)
    assert gpu.energy_joules is not None and 5000.0 <= gpu.energy_joules < 5000.0 + 350.0 * 60  # NVML mJ -> J
    (process,) = gpu.processes or []
    # a sole holder takes the device's figures (DESIGN §3): its per-process utilisation is not read
    assert (process.pid, process.pod_uid, process.container, process.sm_percent) == (1001, UID_TRAIN, "main", None)
    assert process.memory_used_bytes == 1500 * 1024**2

    # an empty sample buffer falls back to nvmlDeviceGetUtilizationRates
    assert samples["GPU-2222"].sm_percent == 3.0

    mig = samples["MIG-5555"]
    assert (mig.parent_uuid, mig.mig_profile, mig.index) == ("GPU-4444", "3g.40gb", 3)
    assert mig.device_units == pytest.approx(3 / 7)
    assert mig.sm_percent == 25.0
    assert mig.energy_joules is not None and mig.energy_joules >= 0.1  # the parent's counter
    assert mig.power_watts is None  # power stays on the parent, it does not add up over instances

    lost = samples["GPU-6666"]
    assert not lost.healthy and lost.sm_percent is None
    assert "GPU is lost" in (lost.error or "")
    assert samples["GPU-3333"].healthy  # the others go on

    devices = [AgentDevice.model_validate(d) for d in snapshot["devices"]]
    by_pod = {d.pod: d for d in devices if d.pod}
    assert (by_pod["train-0"].uuid, by_pod["train-0"].units, by_pod["train-0"].state) == ("GPU-1111", 1.0, "active")
    assert by_pod["train-0"].pod_uid == UID_TRAIN
    assert by_pod["notebook"].state == "idle-held"  # 3 % < the 5 % threshold, a process holds memory
    assert (by_pod["infer-a"].device_id, by_pod["infer-a"].units, by_pod["infer-a"].pod_uid) == (
        "GPU-3333::0", 0.25, None,  # two pods share the GPU: their UIDs show per process, below
    )
    assert by_pod["infer-b"].units == 0.25
    assert (by_pod["mig-job"].uuid, by_pod["mig-job"].pod_uid) == ("MIG-5555", UID_MIG)
    assert by_pod["mig-job"].units == pytest.approx(3 / 7)
    shared = {p.pid: (p.pod_uid, p.sm_percent) for p in samples["GPU-3333"].processes or []}
    # two pods hold it: the driver's per-process utilisation splits it
    assert shared == {1003: (UID_INFER_A, 10.0), 1004: (UID_INFER_B, 30.0)}
    unallocated = [d for d in devices if d.uuid == "GPU-6666"]
    assert [(d.state, d.healthy, d.pod) for d in unallocated] == [("unknown", False, None)]


def test_process_utilization_unsupported_leaves_it_unknown(fake_nvml_lib: Path, tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path / "s.txt", "gpu uuid=GPU-a util=60 proc_util=0\nproc device=GPU-a pid=7 used_mib=10 sm=50\n")
    snapshot = _once(fake_nvml_lib, scenario, "--pod-resources-socket", str(tmp_path / "none.sock"))
    (sample,) = snapshot["samples"]
    assert sample["sm_percent"] == 60.0
    assert sample["processes"] == [
        {"pid": 7, "pod_uid": None, "container": None, "sm_percent": None, "memory_used_bytes": 10 * 1024**2}
    ]


@pytest.mark.parametrize("interval", ["1", "15"])
def test_utilisation_samples_read_whether_or_not_they_fit_one_call(fake_nvml_lib: Path, tmp_path: Path,
                                                                    interval: str) -> None:
    """The first poll asks for the samples of one interval back: 6 at 1 s fit the agent's one-call buffer, 90 at
    15 s do not (INSUFFICIENT_SIZE, then the two calls); both give the interval's mean, not the instant value."""
    scenario = write_scenario(tmp_path / "s.txt", "gpu uuid=GPU-a util=0/100 instant_util=7 mem_util=30\n")
    snapshot = _once(fake_nvml_lib, scenario, "--pod-resources-socket", str(tmp_path / "none.sock"),
                     "--interval", interval)
    (sample,) = snapshot["samples"]
    assert 30.0 <= sample["sm_percent"] <= 70.0  # the 0/100 pattern's mean
    assert sample["memory_activity_percent"] == 30.0


def test_no_library_is_one_clear_line_and_exit_1(tmp_path: Path) -> None:
    result = run_once(None, None)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if "NVIDIA driver not found" in line]
    assert len(lines) == 1, result.stderr
    assert result.stdout == ""


def test_driver_not_loaded(fake_nvml_lib: Path, tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path / "s.txt", "driver init_error=9\ngpu uuid=GPU-a\n")
    result = run_once(fake_nvml_lib, scenario)
    assert result.returncode == 1
    assert "Driver Not Loaded" in result.stderr
    assert "Traceback" not in result.stderr


def test_busy_device_without_process_samples_leaves_process_sm_unknown(fake_nvml_lib: Path, tmp_path: Path) -> None:
    """Two pods' processes on each GPU (found by their cgroups, no pod-resources): per-process utilisation is read."""
    scenario = write_scenario(
        tmp_path / "s.txt",
        "gpu uuid=GPU-busy util=70\ngpu uuid=GPU-idle util=0\n"
        "proc device=GPU-busy pid=1 used_mib=10 sm=-1\nproc device=GPU-busy pid=3 used_mib=10 sm=-1\n"
        "proc device=GPU-idle pid=2 used_mib=10 sm=-1\nproc device=GPU-idle pid=4 used_mib=10 sm=-1\n",
    )
    proc_root = tmp_path / "proc"
    for pid in (1, 2, 3, 4):
        (proc_root / str(pid)).mkdir(parents=True)
        (proc_root / str(pid) / "cgroup").write_text(
            f"0::/kubepods.slice/kubepods-pod0000000{pid}_0000_4000_8000_000000000000.slice/cri-containerd-{pid:064x}.scope\n")
    snapshot = _once(fake_nvml_lib, scenario, "--pod-resources-socket", str(tmp_path / "none.sock"),
                     "--proc-root", str(proc_root))
    sm = {s["uuid"]: {p["sm_percent"] for p in s["processes"]} for s in snapshot["samples"]}
    # busy with no per-process sample: unknown (the engine falls back to the device figure); idle: 0 %
    assert sm == {"GPU-busy": {None}, "GPU-idle": {0.0}}


def test_sole_holder_processes_carry_no_sm_figure(fake_nvml_lib: Path, tmp_path: Path) -> None:
    """One process (one pod) on a GPU: its SM figure would decide nothing, so none is read (None, not 0)."""
    scenario = write_scenario(tmp_path / "s.txt", "gpu uuid=GPU-a util=70\nproc device=GPU-a pid=1 used_mib=10 sm=60\n")
    snapshot = _once(fake_nvml_lib, scenario, "--pod-resources-socket", str(tmp_path / "none.sock"))
    (sample,) = snapshot["samples"]
    assert sample["sm_percent"] == 70.0
    assert [(p["pid"], p["sm_percent"]) for p in sample["processes"]] == [(1, None)]


@pytest.fixture(scope="module")
def minimal_nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_nvml(tmp_path_factory.mktemp("fakenvml-minimal"), minimal=True)


def test_a_driver_with_only_the_basic_calls(minimal_nvml_lib: Path, tmp_path: Path) -> None:
    """An old or partial NVML: every optional figure is null, the GPUs are still sampled and healthy."""
    scenario = write_scenario(tmp_path / "s.txt", "gpu uuid=GPU-old util=10 instant_util=35\nproc device=GPU-old pid=3 sm=5\n")
    snapshot = _once(minimal_nvml_lib, scenario, "--pod-resources-socket", str(tmp_path / "none.sock"))
    (sample,) = snapshot["samples"]
    assert sample["healthy"] and sample["error"] is None
    assert sample["sm_percent"] == 35.0  # nvmlDeviceGetUtilizationRates, the only figure it has
    assert sample["memory_used_bytes"] is None and sample["energy_joules"] is None and sample["processes"] is None
    # busy (35 %) though nobody is known to hold it and no process list exists: active, holder unknown (DESIGN §3)
    assert [(d["state"], d["pod"]) for d in snapshot["devices"]] == [("active", None)]
