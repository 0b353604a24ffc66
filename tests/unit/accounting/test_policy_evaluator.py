"""The idle policies' evaluator, pure, over the real engine's figures.

Each scenario runs pod and sample events through the engine and evaluates the policy every ten
seconds, as the controller does each status interval: thresholds, delays, warn before acting,
a workload resumed by a person, exemptions with an expiry, dry runs, failures retried with backoff,
and unmonitored or stale time, which never brings a step closer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from gpuwm.accounting import (
    Engine,
    EngineConfig,
    Policy,
    PolicyError,
    PolicyEvaluator,
    PolicyOutlook,
    Result,
    Step,
    Subject,
)
from gpuwm.model import GpuSample, PodEvent, WorkloadEvent, WorkloadFigures

SmAt = Callable[[int], float | None]


def idle(_t: int) -> float | None:
    return 0.0


def pod(t: float, name: str = "nb-0", phase: str = "Running", *, uid: str = "pod-nb-0", workload: str = "nb",
        kind: str = "Deployment", node: str = "n1", devices: tuple[tuple[str, float], ...] = (("GPU-a", 1.0),)
        ) -> PodEvent:
    return PodEvent.model_validate({
        "t": t, "event": "pod", "namespace": "ml", "name": name, "uid": uid, "phase": phase, "node": node,
        "workload": {"apiVersion": "apps/v1", "kind": kind, "name": workload, "uid": f"wl-{workload}", "created": 0.0},
        "devices": [{"uuid": uuid, "units": units} for uuid, units in devices],
    })


def policy(**spec: Any) -> Policy:
    base: dict[str, Any] = {"idleFor": "60s", "actions": [{"type": "warn"}], "dryRun": False}
    return Policy.parse("idle", None, {**base, **spec})


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Run:
    """Events in, an evaluation every `every` seconds; each due step recorded with `result(step)`. `until` goes on
    from where the last call stopped, with the same engine and evaluator."""

    policies: list[Policy]
    events: Sequence[PodEvent | WorkloadEvent] = field(default_factory=list)
    sm: SmAt = idle
    every: int = 10
    annotations: Mapping[str, str] = field(default_factory=dict)
    stale: Callable[[int], bool] = lambda _t: False
    result: Callable[[Step], Result] = lambda step: "DryRun" if step.dry_run else "Succeeded"
    evaluator: PolicyEvaluator = field(default_factory=PolicyEvaluator)
    outlooks: dict[str, PolicyOutlook] = field(default_factory=dict)
    engine: Engine = field(default_factory=lambda: Engine(EngineConfig(interval_seconds=1.0)))
    next_evaluation: int = 0
    sampled_until: int = -5  # the GPU sampled from before the pod starts: its first second is monitored

    def until(self, end: int) -> list[tuple[int, Step]]:
        samples = [GpuSample(t=float(t), node="n1", uuid="GPU-a", sm_percent=value, model="NVIDIA H100 80GB HBM3")
                   for t in range(self.sampled_until + 1, end + 1) if (value := self.sm(t)) is not None]
        self.sampled_until = end
        fresh: list[PodEvent | WorkloadEvent | GpuSample] = [
            event for event in self.events if not self.next_evaluation or event.t > self.next_evaluation - self.every]
        pending = sorted([*fresh, *samples], key=lambda event: event.t)
        done: list[tuple[int, Step]] = []
        for now in range(self.next_evaluation, end + 1, self.every):
            while pending and pending[0].t <= now:
                self.engine.observe(pending.pop(0))
            subjects = [self.subject(figures, now) for figures in self.engine.workloads(float(now))]
            steps, self.outlooks = self.evaluator.evaluate(self.policies, subjects, float(now))
            for step in steps:
                done.append((now, step))
                self.evaluator.record(step, self.result(step), float(now))
            self.next_evaluation = now + self.every
        return done

    def subject(self, figures: WorkloadFigures, now: int) -> Subject:
        return Subject(figures=figures, reporting=figures.sampling and not self.stale(now),
                       annotations=self.annotations)


def actions(done: list[tuple[int, Step]]) -> list[tuple[int, str]]:
    return [(t, step.action) for t, step in done]


def test_warns_once_observed_idle_for_idle_for() -> None:
    done = Run([policy()], [pod(0)]).until(300)
    assert actions(done) == [(60, "warn")]  # once per idle spell, however long it lasts


@pytest.mark.parametrize(("sm", "warned"), [(0.5, True), (1.0, False), (80.0, False)])
def test_idle_is_below_the_engines_threshold(sm: float, warned: bool) -> None:
    done = Run([policy()], [pod(0)], sm=lambda _t: sm).until(200)
    assert bool(done) is warned


def test_steps_come_in_order_each_after_its_delay() -> None:
    spec = {"actions": [{"type": "warn"}, {"type": "scaleToZero", "after": "30s"}]}
    done = Run([policy(**spec)], [pod(0)]).until(300)
    assert actions(done) == [(60, "warn"), (90, "scaleToZero")]
    assert done[1][1].due_at == 90.0 and done[1][1].idle_seconds == 90.0


def test_a_step_that_does_not_fit_the_kind_is_left_out() -> None:
    spec = {"actions": [{"type": "warn"}, {"type": "suspend", "after": "10s"}, {"type": "scaleToZero", "after": "20s"}]}
    done = Run([policy(**spec)], [pod(0)]).until(300)
    assert actions(done) == [(60, "warn"), (80, "scaleToZero")]  # a Deployment cannot be suspended
    job = Run([policy(**spec)], [pod(0, kind="Job")]).until(300)
    assert actions(job) == [(60, "warn"), (70, "suspend")]


def test_a_late_policy_warns_first_and_acts_only_after_the_delay() -> None:
    """Idle for long before the policy exists: the warning comes at once, the action its delay later."""
    run = Run([], [pod(0)])
    assert run.until(600) == []
    run.policies = [policy(actions=[{"type": "warn"}, {"type": "scaleToZero", "after": "2m"}])]
    assert actions(run.until(900)) == [(610, "warn"), (730, "scaleToZero")]


def test_a_workload_resumed_by_a_person_must_be_idle_the_whole_period_again() -> None:
    spec = {"actions": [{"type": "warn"}, {"type": "scaleToZero", "after": "30s"}]}
    events = [pod(0), pod(95, phase="Deleted"),  # scaled to zero: its pod goes
              pod(200, name="nb-1", uid="pod-nb-1")]  # a person scales it up again
    done = Run([policy(**spec)], events).until(400)
    assert actions(done) == [(60, "warn"), (90, "scaleToZero"), (260, "warn"), (290, "scaleToZero")]


def test_activity_ends_the_episode() -> None:
    def sm(t: int) -> float:
        return 90.0 if 70 <= t <= 75 else 0.0  # used briefly after the warning

    spec = {"actions": [{"type": "warn"}, {"type": "scaleToZero", "after": "60s"}]}
    done = Run([policy(**spec)], [pod(0)], sm=sm).until(300)
    # the scale-down the first warning announced never comes: the idle period starts again at 75
    assert actions(done) == [(60, "warn"), (140, "warn"), (200, "scaleToZero")]


def test_unmonitored_time_never_counts() -> None:
    never_sampled = Run([policy()], [pod(0)], sm=lambda _t: None).until(600)
    assert never_sampled == []

    def gap(t: int) -> float | None:
        return None if 31 <= t <= 300 else 0.0  # the agent silent for 270 s of an idle stretch

    done = Run([policy()], [pod(0)], sm=gap).until(600)
    # 30 s observed before the gap; 30 more after samples resume at 301: never at the gap's end
    assert actions(done) == [(340, "warn")]


def test_stale_figures_are_left_alone_until_they_are_current() -> None:
    done = Run([policy()], [pod(0)], stale=lambda t: 50 <= t <= 150).until(300)
    assert actions(done) == [(160, "warn")]


def test_exempt_by_annotation_until_it_expires() -> None:
    spec = {"actions": [{"type": "warn"}, {"type": "scaleToZero", "after": "30s"}]}
    forever = Run([policy(**spec)], [pod(0)], annotations={"gpuwm.io/idle-policy": "exempt"}).until(600)
    assert forever == []
    expiring = {"gpuwm.io/idle-policy": "exempt", "gpuwm.io/idle-policy-exempt-until": rfc3339(200)}
    done = Run([policy(**spec)], [pod(0)], annotations=expiring).until(600)
    assert actions(done) == [(200, "warn"), (230, "scaleToZero")]
    typo = {"gpuwm.io/idle-policy": "exempt", "gpuwm.io/idle-policy-exempt-until": "next week"}
    assert Run([policy(**spec)], [pod(0)], annotations=typo).until(600) == []  # not a time: still exempt


def test_exempt_by_the_policys_list() -> None:
    listed = policy(exempt=[{"name": "nb", "namespace": "ml"}])
    assert Run([listed], [pod(0)]).until(300) == []
    other = policy(exempt=[{"name": "nb", "kind": "Job"}])
    assert actions(Run([other], [pod(0)]).until(300)) == [(60, "warn")]
    expired = policy(exempt=[{"name": "nb", "until": rfc3339(100)}])
    assert actions(Run([expired], [pod(0)]).until(300)) == [(100, "warn")]


def test_selection_by_namespace_project_kind_labels_and_size() -> None:
    assert Run([policy(selector={"excludeNamespaces": ["ml"]})], [pod(0)]).until(200) == []
    assert Run([policy(selector={"namespaces": ["prod"]})], [pod(0)]).until(200) == []
    assert Run([policy(selector={"kinds": ["Notebook"]})], [pod(0)]).until(200) == []
    assert Run([policy(selector={"projects": ["other"]})], [pod(0)]).until(200) == []
    assert Run([policy(selector={"matchLabels": {"team": "a"}})], [pod(0)]).until(200) == []
    assert Run([policy(minAllocatedGpus=2)], [pod(0)]).until(200) == []
    assert Run([policy(selector={"projects": ["ml"], "kinds": ["Deployment"]})], [pod(0)]).until(200) != []
    namespaced = Policy.parse("mine", "ml", {"idleFor": "60s", "actions": [{"type": "warn"}], "dryRun": False})
    cluster = policy(idleFor="10s")
    done = Run([cluster, namespaced], [pod(0)]).until(200)
    assert [(t, step.policy) for t, step in done] == [(60, "ml/mine")]  # the namespace's own replaces the default


def test_dry_run_lists_what_it_would_do_and_when() -> None:
    spec = {"actions": [{"type": "warn"}, {"type": "scaleToZero", "after": "30s"}], "dryRun": True}
    run = Run([policy(**spec)], [pod(0)])
    done = run.until(70)
    assert actions(done) == [(60, "warn")] and done[0][1].dry_run
    planned = [(p.action, p.at, p.state) for p in run.outlooks["idle"].planned]
    assert planned == [("warn", 60.0, "WouldHaveRun"), ("scaleToZero", 90.0, "Pending")]
    assert actions(run.until(200)) == [(90, "scaleToZero")]  # all dry: the chain goes on as if each was done


def test_outlook_counts_and_plans_before_the_trigger() -> None:
    run = Run([policy(actions=[{"type": "warn", "after": "5s"}])], [pod(0)])
    assert run.until(40) == []
    outlook = run.outlooks["idle"]
    assert outlook.matched == 1 and outlook.triggered == 0
    assert [(p.action, p.at, p.state) for p in outlook.planned] == [("warn", 65.0, "Pending")]
    run.until(70)
    assert run.outlooks["idle"].triggered == 1


def test_a_failed_step_is_tried_again_with_backoff() -> None:
    tries: list[int] = []

    def flaky(step: Step) -> Result:
        tries.append(int(step.due_at))
        return "Failed" if len(tries) < 3 else "Succeeded"

    spec = {"actions": [{"type": "scaleToZero"}]}
    done = Run([policy(**spec)], [pod(0)], result=flaky).until(300)
    # due at 60; failed: again 30 s later (90), failed: 60 s later (150), then done, never again
    assert actions(done) == [(60, "scaleToZero"), (90, "scaleToZero"), (150, "scaleToZero")]


def test_underused_triggers_once_the_whole_window_was_observed() -> None:
    spec = {"idleFor": "1h", "utilizationBelowPercent": 10, "window": "1m"}
    done = Run([policy(**spec)], [pod(0)], sm=lambda _t: 5.0).until(300)
    # busy (5 % >= the 1 % threshold) so never idle, yet under-used: observed from 10, the minute whole at 70
    assert actions(done) == [(70, "warn")]
    assert Run([policy(**spec)], [pod(0)], sm=lambda _t: 50.0).until(300) == []


def test_kueue_workloads_are_suspended_through_kueue() -> None:
    admitted = WorkloadEvent.model_validate({
        "t": 0.0, "event": "workload", "namespace": "ml", "name": "nb", "uid": "wl-nb", "kind": "PyTorchJob",
        "apiVersion": "kubeflow.org/v1", "requestedGpus": 1, "local_queue": "team", "cluster_queue": "gpus"})
    done = Run([policy(actions=[{"type": "suspend"}])], [admitted, pod(0, kind="PyTorchJob")]).until(100)
    assert [(t, step.action, step.via_kueue) for t, step in done] == [(60, "suspend", True)]
    plain = Run([policy(actions=[{"type": "suspend"}])], [pod(0, kind="PyTorchJob")]).until(100)
    assert [(t, step.action, step.via_kueue) for t, step in plain] == [(60, "suspend", False)]


def test_memory_survives_save_and_restore() -> None:
    spec = {"actions": [{"type": "warn"}, {"type": "scaleToZero", "after": "30s"}]}
    run = Run([policy(**spec)], [pod(0)])
    run.until(70)
    restored = PolicyEvaluator.restore(run.evaluator.save())
    assert restored.progress == run.evaluator.progress and restored.watches == run.evaluator.watches


@pytest.mark.parametrize(("spec", "field"), [
    ({"idleFor": "soon", "actions": [{"type": "warn"}]}, "spec.idleFor"),
    ({"idleFor": "1m", "actions": []}, "spec.actions"),
    ({"idleFor": "1m", "actions": [{"type": "reboot"}]}, "spec.actions.0.type"),
    ({"idleFor": "1m", "actions": [{"type": "warn", "after": "later"}]}, "spec.actions[0].after"),
])
def test_a_bad_policy_is_refused_naming_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(PolicyError, match=field.replace("[", r"\[").replace("]", r"\]")):
        Policy.parse("bad", None, spec)


def test_a_policy_that_changed_starts_again_warning_first() -> None:
    """A dry run switched off: the steps it passed are not taken as done; the workloads idle now are warned at
    once and acted on after the delay."""
    spec = {"actions": [{"type": "warn"}, {"type": "scaleToZero", "after": "30s"}], "dryRun": True}
    run = Run([policy(**spec)], [pod(0)])
    assert [(t, step.action, step.dry_run) for t, step in run.until(200)] == [(60, "warn", True),
                                                                            (90, "scaleToZero", True)]
    run.policies = [policy(**{**spec, "dryRun": False})]
    run.evaluator.forget_policy("idle")
    assert [(t, step.action, step.dry_run) for t, step in run.until(400)] == [(210, "warn", False),
                                                                            (240, "scaleToZero", False)]
