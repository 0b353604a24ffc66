"""The simulator: deterministic, realistic in shape, and the engine agrees with its ground truth."""

from __future__ import annotations

import io
import json
from collections import defaultdict
from pathlib import Path

import pytest

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.cli import main
from gpuwm.model import GpuSample, PodEvent, WorkloadEvent
from gpuwm.sim.fleet import H100
from gpuwm.sim.simulator import (
    REQUEUE_BACKOFF_SECONDS,
    AgentOutage,
    GpuLoss,
    SimConfig,
    Simulator,
    Step,
    default_faults,
)
from gpuwm.sim.trace import truth_report, write_trace
from gpuwm.sim.truth import TruthFigures

INTERVAL = 2.0
HOUR = 3600.0
MAX_POWER_WATTS = H100.power_limit_watts
FIGURES = ("allocated_gpu_seconds", "active_gpu_seconds", "idle_gpu_seconds", "unmonitored_gpu_seconds", "energy_joules")


def small_config(**overrides: object) -> SimConfig:
    """4 nodes (2 whole, MIG, time-sliced) of 2 GPUs, sampled every 2 s."""
    values: dict[str, object] = {"seed": 12, "nodes": 4, "gpus_per_node": 2, "interval_seconds": INTERVAL}
    values.update(overrides)
    return SimConfig.model_validate(values)


def run_through_engine(simulator: Simulator, until: float) -> tuple[Engine, list[Step]]:
    engine = Engine(EngineConfig(interval_seconds=simulator.config.interval_seconds))
    steps = []
    for step in simulator.run(until):
        for sample in step.samples:
            engine.observe_sample(sample)
        for event in step.events:
            engine.observe(event)
        steps.append(step)
    return engine, steps


def assert_engine_matches_truth(simulator: Simulator, engine: Engine, energy_measured: bool = True) -> None:
    """Every workload's figures equal the simulator's; `energy_measured=False`: energy drawn
    after a node's latest sample is not reported yet (no counter read), so only <= holds."""
    truth = simulator.truth()
    reported = {figures.uid: figures for figures in engine.workloads(simulator.clock)}
    assert set(reported) == set(truth)
    for uid, expected in truth.items():
        figures = reported[uid]
        for name in FIGURES:
            if name == "energy_joules":
                assert_energy(figures.energy_joules, expected, energy_measured)
                continue
            assert getattr(figures, name) == pytest.approx(getattr(expected, name), rel=1e-9, abs=1e-6), (
                simulator.workloads[uid].kind, simulator.workloads[uid].request, name)
        kind = simulator.workloads[uid].kind
        assert figures.requested_gpus == (None if expected.requested_gpus is None
                                          else pytest.approx(expected.requested_gpus, rel=1e-12)), (kind, uid)
        assert figures.queued_seconds == pytest.approx(expected.queued_seconds, abs=1e-6), (kind, uid, "queued")
        assert figures.wait_seconds == pytest.approx(expected.wait_seconds, abs=1e-6), (kind, uid, "wait")
        lifetime = expected.lifetime_utilization_percent
        if lifetime is None:
            assert figures.utilization.lifetime is None
        else:
            assert figures.utilization.lifetime == pytest.approx(lifetime, abs=1e-6)


def assert_energy(reported: float, expected: TruthFigures, measured: bool = True) -> None:
    """Exact where every interval was monitored; within an unmonitored gap the counter's delta is
    spread evenly over the gap, so at most the top power x the unmonitored GPU-seconds can differ."""
    slack = MAX_POWER_WATTS * expected.unmonitored_gpu_seconds
    if not measured:
        assert reported <= expected.energy_joules + slack + 1e-6
        return
    assert reported == pytest.approx(expected.energy_joules, rel=1e-9, abs=1e-6 + slack)


@pytest.fixture(scope="module")
def clean_run() -> tuple[Simulator, Engine, list[Step]]:
    simulator = Simulator(small_config())
    engine, steps = run_through_engine(simulator, 2 * HOUR)
    return simulator, engine, steps


def test_same_seed_same_bytes_other_seed_other_run() -> None:
    def trace(seed: int) -> str:
        out = io.StringIO()
        write_trace(Simulator(small_config(seed=seed)), 600.0, out)
        return out.getvalue()

    first, second, other = trace(5), trace(5), trace(6)
    assert first == second
    assert first != other
    assert len(first.splitlines()) > 300


def test_engine_matches_ground_truth_without_faults(clean_run: tuple[Simulator, Engine, list[Step]]) -> None:
    simulator, engine, _ = clean_run
    assert_engine_matches_truth(simulator, engine)
    truth = simulator.truth()
    assert sum(f.unmonitored_gpu_seconds for f in truth.values()) == 0.0
    assert sum(f.active_gpu_seconds for f in truth.values()) > 0
    assert sum(f.idle_gpu_seconds for f in truth.values()) > 0
    placed = {simulator.workloads[uid].request.node_kind for uid, f in truth.items() if f.allocated_gpu_seconds > 0}
    assert placed == {"whole", "mig", "shared"}  # every kind of device was held and accounted


def test_every_workload_kind_and_a_queue(clean_run: tuple[Simulator, Engine, list[Step]]) -> None:
    simulator, engine, steps = clean_run
    assert {workload.kind for workload in simulator.workloads.values()} == {"training", "batch", "notebook", "inference"}
    waiting_since: dict[str, float] = {}  # a pod Pending, or a Kueue job suspended, since
    waited = []
    for step in steps:
        for event in step.events:
            if isinstance(event, WorkloadEvent) and event.suspended:
                waiting_since.setdefault(event.uid, event.t)
            elif isinstance(event, WorkloadEvent) and event.uid in waiting_since:
                waited.append(event.t - waiting_since.pop(event.uid))
            elif isinstance(event, PodEvent) and event.phase == "Pending":
                waiting_since[event.uid] = event.t
            elif isinstance(event, PodEvent) and event.phase == "Running" and event.uid in waiting_since:
                waited.append(event.t - waiting_since.pop(event.uid))
    assert any(seconds > 0 for seconds in waited), "no workload ever waited for capacity"
    figures = {f.uid: f for f in engine.workloads(simulator.clock)}
    queued = [f for f in figures.values() if f.wait_seconds > 0 and f.start_time is not None]
    assert queued


def test_samples_have_the_shape_of_each_device_kind(clean_run: tuple[Simulator, Engine, list[Step]]) -> None:
    simulator, _, steps = clean_run
    samples = [sample for step in steps for sample in step.samples]
    parents = {gpu.uuid: gpu for node in simulator.nodes for gpu in node.gpus}
    by_t_uuid = {(s.t, s.uuid): s for s in samples}
    mig = [s for s in samples if s.parent_uuid is not None]
    assert mig
    for sample in mig[:500]:
        parent = by_t_uuid[(sample.t, sample.parent_uuid or "")]
        assert sample.energy_joules == parent.energy_joules  # the parent's counter
        assert sample.power_watts is None and sample.mig_profile is not None
        assert 0 < sample.device_units < 1
    shared = [s for s in samples if parents.get(s.uuid) is not None and parents[s.uuid].kind == "shared"]
    with_processes = [s for s in shared if s.processes]
    assert with_processes
    for sample in with_processes:
        device_sm = sum(p.sm_percent or 0.0 for p in sample.processes or [])
        assert sample.sm_percent == pytest.approx(min(100.0, device_sm), abs=0.01)
        assert all(p.pod_uid for p in sample.processes or [])
    counters: dict[str, list[float]] = defaultdict(list)
    for sample in samples:
        if sample.parent_uuid is None and sample.energy_joules is not None:
            counters[sample.uuid].append(sample.energy_joules)
    for values in counters.values():
        assert values == sorted(values)
    busy = [s for s in samples if (s.sm_percent or 0) > 50]
    assert all((s.power_watts or 0) > parents[s.uuid].product.idle_power_watts for s in busy if s.uuid in parents)


def test_agent_outage_and_lost_gpu_are_unmonitored_and_match_truth() -> None:
    probe = Simulator(small_config())
    nodes = [node.name for node in probe.nodes]
    outages, losses = default_faults(nodes, 0.0, HOUR)
    simulator = Simulator(small_config(outages=outages, gpu_losses=losses))
    engine, steps = run_through_engine(simulator, HOUR)
    assert_engine_matches_truth(simulator, engine)
    truth = simulator.truth()
    assert sum(f.unmonitored_gpu_seconds for f in truth.values()) > 0
    lost = [s for step in steps for s in step.samples if not s.healthy]
    assert lost and all(s.sm_percent is None and s.error == "GPU is lost" for s in lost)
    assert {s.node for s in lost} == {losses[0].node}
    outage = outages[0]
    silent = [s for step in steps for s in step.samples if s.node == outage.node and outage.start <= s.t < outage.end]
    assert silent == []


def test_outage_at_the_end_counts_as_unmonitored_until_now() -> None:
    probe = Simulator(small_config())
    node = probe.nodes[0].name
    simulator = Simulator(small_config(outages=(AgentOutage(node=node, start=1800.0, end=10 * HOUR),)))
    engine, steps = run_through_engine(simulator, HOUR)
    assert_engine_matches_truth(simulator, engine, energy_measured=False)
    held_on_node = {  # from before the outage (held through it, or till a preemption or its end)
        event.workload.uid for step in steps for event in step.events
        if isinstance(event, PodEvent) and event.node == node and event.phase == "Running" and event.t < 1800.0
    }
    truth = simulator.truth()
    assert any(truth[uid].unmonitored_gpu_seconds >= 1700.0 for uid in held_on_node)


def test_fault_on_unknown_node_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown node 'nope'"):
        Simulator(small_config(gpu_losses=(GpuLoss(node="nope", gpu_index=0, at=1.0),)))


def test_replay_of_the_written_trace_matches_ground_truth(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    probe = Simulator(small_config(seed=23))
    outages, losses = default_faults([node.name for node in probe.nodes], 0.0, 1800.0)
    simulator = Simulator(small_config(seed=23, outages=outages, gpu_losses=losses))
    trace = tmp_path / "sim.jsonl"
    with trace.open("w") as out:
        write_trace(simulator, 1800.0, out)
    truth = truth_report(simulator)
    assert main(["replay", str(trace), "--interval", str(INTERVAL)]) == 0
    report = json.loads(capsys.readouterr().out)
    replayed = {(w["namespace"], w["name"]): w for w in report["workloads"]}
    assert len(replayed) == len(truth["workloads"]) > 5
    assert any(w["phase"] == "Queued" for w in replayed.values())  # the trace's workload events were read
    for expected in truth["workloads"]:
        got = replayed[(expected["namespace"], expected["name"])]
        for name in ("allocatedGpuSeconds", "activeGpuSeconds", "idleGpuSeconds", "unmonitoredGpuSeconds",
                     "queuedSeconds", "waitSeconds"):
            assert got[name] == pytest.approx(expected[name], rel=1e-9, abs=1e-6), (expected["name"], name)
        assert got["requestedGpus"] == expected["requestedGpus"]
        slack = MAX_POWER_WATTS * expected["unmonitoredGpuSeconds"]
        assert got["energyJoules"] == pytest.approx(expected["energyJoules"], rel=1e-9, abs=1e-6 + slack)


def test_samples_validate_as_the_model() -> None:
    simulator = Simulator(small_config(seed=3))
    for step in simulator.run(60.0):
        for sample in step.samples:
            GpuSample.model_validate(sample.model_dump())


def test_a_node_whose_agent_sees_no_process_still_reads_busy() -> None:
    # node 0 of a 4-node fleet hides its processes (an agent without hostPID): every sample's list is empty
    simulator = Simulator(small_config())
    assert simulator.nodes[0].hides_processes and not any(node.hides_processes for node in simulator.nodes[1:])
    engine, steps = run_through_engine(simulator, 2 * HOUR)
    hidden = [sample for step in steps for sample in step.samples if sample.node == simulator.nodes[0].name]
    assert hidden and all(sample.processes == [] for sample in hidden if sample.healthy)
    assert_engine_matches_truth(simulator, engine)
    on_hidden_node = [
        figures for figures in engine.workloads(simulator.clock) if simulator.nodes[0].name in figures.nodes
    ]
    busy = [figures for figures in on_hidden_node if figures.active_gpu_seconds > 0]
    assert busy, "the workloads of the node that hides its processes must read busy, not idle"
    assert all(figures.unattributed_gpu_seconds > 0 for figures in busy)


@pytest.fixture(scope="module")
def queue_run() -> tuple[Simulator, Engine, list[Step]]:
    """A busy fleet (every unit wanted) for 3 hours: jobs queue in Kueue, are preempted and come back."""
    simulator = Simulator(small_config(seed=3, gpus_per_node=4, occupancy=1.0, interval_seconds=5.0))
    engine, steps = run_through_engine(simulator, 3 * HOUR)
    return simulator, engine, steps


def test_queued_preempted_and_never_admitted_workloads_match_ground_truth(
    queue_run: tuple[Simulator, Engine, list[Step]],
) -> None:
    simulator, engine, _ = queue_run
    assert_engine_matches_truth(simulator, engine)  # requested GPUs, queued and wait seconds included
    now = simulator.clock
    figures = {f.uid: f for f in engine.workloads(now)}
    workloads = simulator.workloads.values()
    admitted_late = [w for w in workloads if w.local_queue and figures[w.uid].queued_seconds > 0 and w.started]
    assert admitted_late, "no job waited in Kueue and was admitted"
    preempted = [w for w in workloads if w.preemptions and w.runs > w.preemptions]
    assert preempted, "no job was preempted and admitted again"
    for workload in preempted:
        f = figures[workload.uid]
        assert f.phase == ("Running" if workload.running else "Failed" if workload.fails else "Succeeded")
        assert f.queued_seconds >= REQUEUE_BACKOFF_SECONDS and f.wait_seconds >= f.queued_seconds - 1e-9
    never = [w for w in workloads if not w.admissible and w.ended is None]
    assert never, "no job waited the whole run"
    for workload in never:
        f = figures[workload.uid]
        assert (f.phase, f.start_time, f.allocated_gpu_seconds) == ("Queued", None, 0.0)
        assert f.queued_seconds == f.wait_seconds == pytest.approx(now - workload.created)
        assert f.cluster_queue == "reserved-h100" and f.local_queue == f"{workload.namespace}-gpus"
    gave_up = [w for w in workloads if not w.admissible and w.ended is not None]
    assert gave_up and all(figures[w.uid].phase == "Ended" for w in gave_up)
    notebooks = [f for uid, f in figures.items() if simulator.workloads[uid].kind == "notebook"]
    assert notebooks and all(f.requested_gpus is None and f.queued_seconds == 0 for f in notebooks)  # pods only


def test_project_figures_are_the_queued_and_pending_workloads_of_the_ground_truth(
    queue_run: tuple[Simulator, Engine, list[Step]],
) -> None:
    simulator, engine, _ = queue_run
    now = simulator.clock
    truth = simulator.truth()
    phases = {f.uid: (f.project, f.phase) for f in engine.workloads(now)}
    projects = {p.name: p for p in engine.projects(now)}
    waiting = 0
    for name, project in projects.items():
        queued = [uid for uid, (of, phase) in phases.items() if of == name and phase == "Queued"]
        pending = [uid for uid, (of, phase) in phases.items() if of == name and phase == "Pending"]
        requested = sum(truth[uid].requested_gpus or 0.0 for uid in queued + pending)
        assert project.requested_gpus == pytest.approx(requested), name
        assert project.queued_workloads == len(queued), name
        assert project.longest_queued_seconds == pytest.approx(max((truth[uid].queued_seconds for uid in queued), default=0.0))
        waiting += len(queued)
    assert waiting > 0


def test_a_kueue_job_has_no_pods_until_admitted_and_new_ones_after_a_preemption(
    queue_run: tuple[Simulator, Engine, list[Step]],
) -> None:
    simulator, _, steps = queue_run
    events = [event for step in steps for event in step.events]
    preempted = next(w for w in simulator.workloads.values() if w.preemptions and w.runs > w.preemptions)
    own = [e for e in events if (isinstance(e, WorkloadEvent) and e.uid == preempted.uid)
           or (isinstance(e, PodEvent) and e.workload.uid == preempted.uid)]
    states = [("workload", e.suspended) if isinstance(e, WorkloadEvent) else ("pod", e.phase) for e in own]
    suspensions = [i for i, state in enumerate(states) if state == ("workload", True)]
    assert len(suspensions) >= 1 + (preempted.created >= simulator.config.start_time)
    for index in suspensions:  # after a suspension: no pod runs until it is admitted again
        following = states[index + 1:]
        admitted = following.index(("workload", False))
        assert ("pod", "Running") not in following[:admitted]
    pods = {e.uid for e in own if isinstance(e, PodEvent)}
    assert len(pods) > len(preempted.pods)  # the pods made after the preemption are new pods
    requested = {e.requested_gpus for e in own if isinstance(e, WorkloadEvent)}
    assert requested == {preempted.request.count * preempted.request.pods * 1.0}
