"""bench/scale.py and bench/faults.py on a tiny cluster: they run, and the controller's pull path loses nothing.

No timing is asserted: the figures the scripts print for speed are for bench/README.md.
What is asserted is the accounting: GPU-seconds reported through the real AgentPuller,
engine and store equal the simulator's ground truth, and each fault costs at most what
its definition allows.
"""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run_table(script: str, *arguments: str) -> list[dict[str, str]]:
    result = subprocess.run([sys.executable, str(BENCH / script), *arguments], capture_output=True, text=True,
                            timeout=240, cwd=BENCH.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("|") and not line.startswith("|---")]
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    return [dict(zip(header, (cell.strip() for cell in row.strip("|").split("|")), strict=True)) for row in rows[1:]]


def test_scale_bench_reports_ground_truth() -> None:
    (row,) = run_table("scale.py", "--nodes", "4", "--gpus-per-node", "2", "--duration", "3m", "--interval", "5",
                       "--growth", "")
    assert float(row["truth_allocated_gpu_s"]) > 0
    assert abs(float(row["lost_allocated_gpu_s"])) < 1e-3
    assert abs(float(row["lost_active_gpu_s"])) < 1e-3
    assert float(row["store_mib"]) > 0 and float(row["bytes_per_row"]) > 0


def test_fault_bench_costs_at_most_one_interval() -> None:
    rows = {row["scenario"]: row for row in run_table(
        "faults.py", "--nodes", "10", "--gpus-per-node", "2", "--duration", "4m", "--interval", "2")}
    api = "API server 503/429 bursts (figures read from the CRs)"
    assert set(rows) == {"baseline", "agent gone 5 min", "GPU lost", "agent SIGKILL (a tenth of the nodes)",
                         "agent 503/429 bursts", "controller restart mid-interval", api}
    for name, row in rows.items():
        lost = float(row["lost_gpu_s"])
        assert abs(lost) <= float(row["one_interval_gpu_s"]), name
        # unmonitored time is never counted as idle: reported idle never exceeds the truth's
        assert float(row["reported_idle_gpu_s"]) <= float(row["truth_idle_gpu_s"]) + 0.1, name
    # the API server's bursts: what the GPUWorkloadMetrics say at the end (their figures rounded to 0.001)
    assert float(rows[api]["reported_allocated_gpu_s"]) > 0
    for name in ("baseline", "agent 503/429 bursts", "controller restart mid-interval", "agent gone 5 min", "GPU lost",
                 api):
        assert abs(float(rows[name]["lost_gpu_s"])) < 0.1, name
        assert float(rows[name]["reported_unmonitored_gpu_s"]) == pytest.approx(
            float(rows[name]["truth_unmonitored_gpu_s"]), abs=0.1), name
    killed = rows["agent SIGKILL (a tenth of the nodes)"]
    # the killed agent's unread samples (at most one status interval of its node's 2 GPUs, plus the
    # sample interval that bridges the gap) become unmonitored
    assert 0 < float(killed["lost_monitored_gpu_s"]) <= 2 * (15.0 + 2.0)
    assert float(killed["reported_unmonitored_gpu_s"]) == pytest.approx(
        float(killed["truth_unmonitored_gpu_s"]) + float(killed["lost_monitored_gpu_s"]), abs=0.1)
    assert float(rows["agent gone 5 min"]["truth_unmonitored_gpu_s"]) > 0
    assert float(rows["GPU lost"]["truth_unmonitored_gpu_s"]) > 0


def test_pull_bench_reads_every_agent() -> None:
    result = subprocess.run([sys.executable, str(BENCH / "pull.py"), "--nodes", "6", "--gpus-per-node", "2",
                             "--pulls", "3", "--every", "4"], capture_output=True, text=True, timeout=240,
                            cwd=BENCH.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    pulls = [line for line in result.stdout.splitlines() if line.startswith("pull ")]
    assert len(pulls) == 3 and all("6 answered, 0 failed" in line for line in pulls)
    # every pull brings each GPU's polls since the last one (merged: the first, the run between, the last)
    assert all(int(line.rsplit(", ", 1)[1].split()[0]) >= 6 * 2 for line in pulls)
    assert result.stdout.splitlines()[-1].startswith("summary: CPU per pull of 6 agents")


def test_cycle_parts_bench_times_each_part_where_every_node_qualifies() -> None:
    result = subprocess.run([sys.executable, str(BENCH / "cycle_parts.py"), "--nodes", "5", "--rounds", "1"],
                            capture_output=True, text=True, timeout=240, cwd=BENCH.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    # every node's devices held whole: `whole_device_nodes` looks at each of the 40 holders
    assert lines[0] == "5 nodes: 20 running workloads, 20 pods, 40 holders; 5 nodes held whole"
    assert [line.split(":")[0] for line in lines[1:]] == [
        "idleness, each helper judging", "idleness, seen once a cycle", "whole_device_nodes"]


def test_store_record_bench_traces_record_s_peak() -> None:
    """`bench/store_record.py --traced-peak`: each interval's peak of allocations in `record`, and their summary."""
    result = subprocess.run([sys.executable, str(BENCH / "store_record.py"), "--nodes", "10", "--intervals", "3",
                             "--traced-peak"], capture_output=True, text=True, timeout=240, cwd=BENCH.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    peaks = [float(line.split("traced peak ")[1].split(" MiB")[0]) for line in lines if line.startswith("interval ")]
    assert len(peaks) == 3 and all(peak > 0 for peak in peaks), lines
    summary = next(line for line in lines if line.startswith("record's traced peak above its start (MiB): "))
    assert f"after it max {max(peaks[1:]):.2f}" in summary, summary


def test_controller_bench_restart_restores_and_resends_nothing() -> None:
    """`bench/controller.py --restart`: the second controller restores the first one's state and, since the
    pods it is handed are those the first one saw (and still exist), tells the engine nothing again."""
    result = subprocess.run([sys.executable, str(BENCH / "controller.py"), "--nodes", "6", "--gpus-per-node", "2",
                             "--gpus-per-workload", "1", "--cycles", "2", "--status-interval", "2",
                             "--history-minutes", "1", "--restart", "--restart-after", "2"],
                            capture_output=True, text=True, timeout=240, cwd=BENCH.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    restored = next(line for line in lines if line.startswith("restored from:"))
    assert restored.startswith("restored from: state (24 CRs adopted)"), restored  # 12 workloads, their projects
    intake = next(line for line in lines if line.startswith("pod intake"))
    assert intake.endswith(", 0 pod events to the engine"), intake
    assert sum(line.startswith("cycle ") for line in lines) == 2


def test_client_twin_bench_runs_the_removed_client() -> None:
    """`bench/client_twin.py`: the twin's run really goes through the client read
    from git, and its status writes land as aiohttp's do."""
    twin = runpy.run_path(str(BENCH / "client_twin.py"))  # the script's names (it runs only as __main__)
    revision, client_path = twin["REVISION"], twin["CLIENT_PATH"]
    try:
        shown = subprocess.run(["git", "-C", str(BENCH.parent), "cat-file", "-e", f"{revision}:{client_path}"],
                               capture_output=True, check=False)
    except OSError as error:
        pytest.skip(f"no git here ({error}): the twin is read from the repository's history")
    if shown.returncode != 0:
        pytest.skip(f"no git history holding {revision} here (a shallow clone or an archive): the twin is read from it")
    result = subprocess.run([sys.executable, str(BENCH / "client_twin.py"), "--pairs", "1", "--", "--nodes", "6",
                             "--gpus-per-node", "2", "--gpus-per-workload", "1", "--cycles", "2", "--status-interval",
                             "2", "--history-minutes", "1"], capture_output=True, text=True, timeout=300, cwd=BENCH.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = [line for line in result.stdout.splitlines() if line.startswith("run ")]
    assert [line.split(":")[0] for line in runs] == ["run 1 (aiohttp)", "run 2 (twin)"]
    assert all("12 of 12 CRs with a status" in line for line in runs), runs
    assert "through the removed client" not in runs[0]
    calls = runs[1].rsplit("; ", 1)[1]
    assert calls.startswith("12 agent GETs and ") and not calls.startswith("12 agent GETs and 0 "), calls
    assert result.stdout.splitlines()[-1].startswith("mean: aiohttp ")
