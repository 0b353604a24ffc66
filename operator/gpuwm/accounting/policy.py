"""Idle policies, decided: which step of which policy is due on which workload, from the engine's figures alone.

A policy (`gpuwm.model.IdlePolicySpec`) triggers on a workload once it has been *observed* idle for
`idleFor`, or (optionally) once its mean utilisation over a window it was observed through is below a
floor; then its steps come in order, each `after` its own delay from the one before (the first from
the trigger). Nothing here talks to Kubernetes: the controller turns due steps into API calls and
reports each result back (`record`), and `gpuwm replay --policy` drives the same evaluator over a trace.

Observed idle time is the part of the current idle stretch that samples covered. Within a stretch
(no GPU of the workload active) every held GPU-second is idle or unmonitored, so the idle GPU-seconds
accrued between two evaluations divided by the units held are the monitored idle seconds between them:
an outage adds nothing, and a stretch first seen mid-way counts only what the evaluation before saw
of it. An evaluation while the workload's figures are stale (`Subject.reporting` false) counts what
was monitored, acts on nothing and ends no episode.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import ValidationError

from gpuwm.config import parse_duration_seconds
from gpuwm.model import (
    EXEMPT_ANNOTATION,
    EXEMPT_UNTIL_ANNOTATION,
    EXEMPT_VALUE,
    ActionType,
    IdlePolicySpec,
    WorkloadFigures,
)

#: workload kinds each acting step applies to; a step whose kind does not fit a workload is left out of its chain
SCALABLE_KINDS = frozenset({"Deployment", "StatefulSet", "LeaderWorkerSet", "Notebook", "RayCluster",
                            "InferenceService"})
SUSPENDABLE_KINDS = frozenset({"Job", "JobSet", "PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob",
                               "TrainJob", "RayJob"})
WINDOW_SECONDS = {"1m": 60.0, "5m": 300.0, "1h": 3600.0}
#: a failed step is tried again after this, doubling with each failure up to the maximum
RETRY_BASE_SECONDS = 30.0
RETRY_MAX_SECONDS = 1800.0


class PolicyError(ValueError):
    """A policy that cannot be used; the message names the field at fault."""


@dataclass(frozen=True)
class Policy:
    """A policy as the evaluator uses it: its key (`NAMESPACE/NAME`, or `NAME` cluster-wide) and parsed spec."""

    key: str
    namespace: str | None
    spec: IdlePolicySpec
    idle_for_seconds: float
    delays_seconds: tuple[float, ...]

    @classmethod
    def parse(cls, name: str, namespace: str | None, spec: Mapping[str, Any]) -> Policy:
        """From a GPUIdlePolicy (`namespace` its own) or ClusterGPUIdlePolicy (`namespace` None) spec."""
        try:
            parsed = IdlePolicySpec.model_validate(spec)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "spec"
            raise PolicyError(f"spec.{where}: {first['msg']}") from None
        idle_for = _duration("spec.idleFor", parsed.idle_for)
        delays = tuple(_duration(f"spec.actions[{index}].after", step.after)
                       for index, step in enumerate(parsed.actions))
        key = f"{namespace}/{name}" if namespace else name
        return cls(key=key, namespace=namespace, spec=parsed, idle_for_seconds=idle_for, delays_seconds=delays)


def _duration(where: str, text: str) -> float:
    try:
        return parse_duration_seconds(text)
    except ValueError as error:
        raise PolicyError(f"{where}: {error}") from None


@dataclass(frozen=True)
class Subject:
    """A workload as the evaluator sees it: its figures, whether they are current, its object's metadata.

    `reporting`: every unit it holds has a recent sample (the controller's judgement of its samples; replay:
    the engine's `sampling`). `labels`, `annotations`: the workload object's, where known.
    """

    figures: WorkloadFigures
    reporting: bool
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


def holds_gpus(figures: WorkloadFigures) -> bool:
    """Running and holding GPU units now: the only workloads that can be idle."""
    return figures.phase == "Running" and figures.allocated_gpus > 0


def applies(action: ActionType, figures: WorkloadFigures) -> bool:
    """Whether a step can act on this workload's kind (warn and delete on any; suspend on Kueue's too)."""
    if action == "scaleToZero":
        return figures.kind in SCALABLE_KINDS
    if action == "suspend":
        return figures.kind in SUSPENDABLE_KINDS or queued_by_kueue(figures)
    return True


def queued_by_kueue(figures: WorkloadFigures) -> bool:
    """Kueue admitted it (or queues it): suspending it means deactivating its Kueue Workload, never its own suspend."""
    return bool(figures.cluster_queue or figures.local_queue)


def parse_time(text: str | None) -> float | None:
    """Epoch seconds of an RFC 3339 time; None when absent or not a time."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def exempt(policy: Policy, subject: Subject, now: float) -> bool:
    """The workload's annotation (until its optional expiry) or the policy's own list exempts it now."""
    figures = subject.figures
    if subject.annotations.get(EXEMPT_ANNOTATION, "").strip().lower() == EXEMPT_VALUE:
        ends = parse_time(subject.annotations.get(EXEMPT_UNTIL_ANNOTATION))
        if ends is None or now < ends:  # an expiry that is not a time does not end it: a typo must not act
            return True
    for entry in policy.spec.exempt:
        if entry.name != figures.name or (entry.namespace and entry.namespace != figures.namespace):
            continue
        if entry.kind and entry.kind != figures.kind:
            continue
        ends = parse_time(entry.until)
        if ends is None or now < ends:
            return True
    return False


def selects(policy: Policy, subject: Subject) -> bool:
    """Whether the policy covers the workload (exemptions aside)."""
    figures, selector = subject.figures, policy.spec.selector
    if policy.namespace is not None and figures.namespace != policy.namespace:
        return False
    if policy.namespace is None and selector.namespaces and figures.namespace not in selector.namespaces:
        return False
    if figures.namespace in selector.exclude_namespaces:
        return False
    if selector.projects and figures.project not in selector.projects:
        return False
    if selector.kinds and figures.kind not in selector.kinds:
        return False
    if selector.phases and figures.phase not in selector.phases:
        return False
    if any(subject.labels.get(key) != value for key, value in selector.match_labels.items()):
        return False
    return figures.allocated_gpus >= policy.spec.min_allocated_gpus


def governing(policies: Iterable[Policy], subject: Subject) -> list[Policy]:
    """The policies that apply to a workload: its namespace's own where one selects it, else the cluster's."""
    chosen = [policy for policy in policies if selects(policy, subject)]
    own = [policy for policy in chosen if policy.namespace is not None]
    return sorted(own or chosen, key=lambda policy: policy.key)


@dataclass
class Watch:
    """What the evaluator has observed of one workload's current idle stretch and of its reporting."""

    stretch: int | None = None  # the stretch's start second (idleSince); None while active
    observed_seconds: float = 0.0
    at: float = 0.0
    idle_gpu_seconds: float = 0.0
    reporting_since: float | None = None


def observe_idle(watch: Watch | None, subject: Subject, now: float) -> Watch | None:
    """The watch after an evaluation at `now`; None for a workload that holds no GPUs."""
    figures = subject.figures
    if not holds_gpus(figures):
        return None
    previous = watch
    watch = Watch(at=now, idle_gpu_seconds=figures.idle_gpu_seconds)
    if subject.reporting:
        since = previous.reporting_since if previous is not None else None
        watch.reporting_since = since if since is not None else now
    if figures.idle_seconds <= 0:
        return watch
    watch.stretch = math.floor(now - figures.idle_seconds + 1e-3)
    if previous is None:
        return watch  # seen first mid-stretch: what came before was not observed here
    elapsed = max(0.0, now - previous.at)
    credit = min(elapsed, max(0.0, figures.idle_gpu_seconds - previous.idle_gpu_seconds) / figures.allocated_gpus)
    if previous.stretch == watch.stretch:
        watch.observed_seconds = previous.observed_seconds + credit
    else:
        watch.observed_seconds = min(credit, figures.idle_seconds)
    return watch


def underused(policy: Policy, subject: Subject, watch: Watch | None, now: float) -> bool:
    """Mean utilisation over the policy's window below its floor, the whole window observed."""
    floor = policy.spec.utilization_below_percent
    if floor is None or watch is None or watch.reporting_since is None or not subject.reporting:
        return False
    window = policy.spec.window
    mean = {"1m": subject.figures.utilization.avg1m, "5m": subject.figures.utilization.avg5m,
            "1h": subject.figures.utilization.avg1h}[window]
    return mean is not None and mean < floor and now - watch.reporting_since >= WINDOW_SECONDS[window]


@dataclass
class Progress:
    """One policy's episode on one workload: since when it triggered, the steps done, a retry after a failure."""

    trigger_at: float
    done: int = 0
    last_step_at: float | None = None
    attempts: int = 0
    retry_at: float | None = None
    dry_run_steps: list[tuple[int, float]] = field(default_factory=list)  # (step, when) a dry run passed


@dataclass(frozen=True)
class Step:
    """A step due now: which policy, which workload, what to do, and since when it was due."""

    policy: str
    uid: str
    namespace: str
    name: str
    kind: str
    api_version: str
    index: int
    action: ActionType
    due_at: float
    dry_run: bool
    via_kueue: bool
    webhook_secret: tuple[str, str] | None  # (Secret name, key) for a warn that also calls a webhook
    idle_seconds: float


@dataclass(frozen=True)
class Planned:
    """A step coming (or passed by a dry run) on a workload, for the policy's status."""

    namespace: str
    name: str
    kind: str
    action: ActionType
    at: float
    state: Literal["Pending", "Due", "WouldHaveRun"]


@dataclass
class PolicyOutlook:
    """What one evaluation found for one policy."""

    matched: int = 0
    triggered: int = 0
    planned: list[Planned] = field(default_factory=list)


Result = Literal["Succeeded", "Failed", "Skipped", "DryRun"]


class PolicyEvaluator:
    """The policies' memory of each workload (observed idleness, each episode's steps) and their decisions.
    `evaluate` once per status interval (or replay step) with every workload; the caller does or tries each
    step it returns and reports through `record`. The same figures, results and times give the same steps."""

    def __init__(self) -> None:
        self.watches: dict[str, Watch] = {}
        self.progress: dict[tuple[str, str], Progress] = {}

    def evaluate(self, policies: list[Policy], subjects: Iterable[Subject], now: float
                 ) -> tuple[list[Step], dict[str, PolicyOutlook]]:
        """The steps due now, and per policy what it covers and plans."""
        outlooks = {policy.key: PolicyOutlook() for policy in policies}
        steps: list[Step] = []
        watches: dict[str, Watch] = {}  # only the workloads seen now: the others are gone
        seen_pairs: set[tuple[str, str]] = set()
        for subject in subjects:
            uid = subject.figures.uid
            watch = observe_idle(self.watches.get(uid), subject, now)
            if watch is not None:
                watches[uid] = watch
            for policy in governing(policies, subject):
                if exempt(policy, subject, now):
                    continue
                outlook = outlooks[policy.key]
                outlook.matched += 1
                seen_pairs.add((policy.key, uid))
                step = self._advance(policy, subject, watch, now, outlook)
                if step is not None:
                    steps.append(step)
        self.watches = watches
        for pair in set(self.progress) - seen_pairs:  # gone, no longer selected, or exempt now
            del self.progress[pair]
        for outlook in outlooks.values():
            outlook.planned.sort(key=lambda planned: (planned.at, planned.namespace, planned.name))
        return steps, outlooks

    def _advance(self, policy: Policy, subject: Subject, watch: Watch | None, now: float,
                 outlook: PolicyOutlook) -> Step | None:
        figures = subject.figures
        pair = (policy.key, figures.uid)
        idle_enough = watch is not None and watch.observed_seconds >= policy.idle_for_seconds
        if not holds_gpus(figures) or not (idle_enough or underused(policy, subject, watch, now)):
            if not holds_gpus(figures) or subject.reporting:
                self.progress.pop(pair, None)  # active again, or its GPUs are gone: the episode is over
            elif pair in self.progress:
                return self._next_step(policy, subject, self.progress[pair], now, outlook)
            self._plan_untriggered(policy, subject, watch, now, outlook)
            return None
        progress = self.progress.get(pair)
        if progress is None:
            excess = watch.observed_seconds - policy.idle_for_seconds if watch is not None and idle_enough else 0.0
            progress = self.progress[pair] = Progress(trigger_at=now - excess)
        outlook.triggered += 1
        return self._next_step(policy, subject, progress, now, outlook)

    def _next_step(self, policy: Policy, subject: Subject, progress: Progress, now: float,
                   outlook: PolicyOutlook) -> Step | None:
        figures = subject.figures
        actions = policy.spec.actions
        for index, passed_at in progress.dry_run_steps:
            outlook.planned.append(Planned(figures.namespace, figures.name, figures.kind, actions[index].type,
                                           passed_at, "WouldHaveRun"))
        while progress.done < len(actions) and not applies(actions[progress.done].type, figures):
            progress.done += 1
        if progress.done >= len(actions):
            return None
        index = progress.done
        base = progress.trigger_at if progress.last_step_at is None else progress.last_step_at
        due = base + policy.delays_seconds[index]
        if progress.retry_at is not None:
            due = max(due, progress.retry_at)
        ready = due <= now and subject.reporting
        action = actions[index]
        outlook.planned.append(Planned(figures.namespace, figures.name, figures.kind, action.type, due,
                                       "Due" if ready else "Pending"))
        if not ready:
            return None
        secret = action.webhook_secret
        return Step(policy=policy.key, uid=figures.uid, namespace=figures.namespace, name=figures.name,
                    kind=figures.kind, api_version=figures.api_version, index=index, action=action.type,
                    due_at=due, dry_run=policy.spec.dry_run, via_kueue=queued_by_kueue(figures),
                    webhook_secret=(secret.name, secret.key) if secret is not None else None,
                    idle_seconds=figures.idle_seconds)

    def _plan_untriggered(self, policy: Policy, subject: Subject, watch: Watch | None, now: float,
                          outlook: PolicyOutlook) -> None:
        """An idle workload not yet idle long enough: when its first step would come if it stays idle."""
        if watch is None or watch.stretch is None or watch.observed_seconds <= 0:
            return
        figures = subject.figures
        for index, action in enumerate(policy.spec.actions):
            if applies(action.type, figures):
                at = now + policy.idle_for_seconds - watch.observed_seconds + policy.delays_seconds[index]
                outlook.planned.append(Planned(figures.namespace, figures.name, figures.kind, action.type, at,
                                               "Pending"))
                return

    def record(self, step: Step, result: Result, now: float) -> None:
        """What became of a step: done (Succeeded, DryRun, Skipped: the next one comes after its delay) or
        Failed (tried again after a backoff)."""
        progress = self.progress.get((step.policy, step.uid))
        if progress is None or progress.done != step.index:
            return  # the episode ended (or moved on) meanwhile
        if result == "Failed":
            progress.attempts += 1
            progress.retry_at = now + min(RETRY_BASE_SECONDS * 2 ** (progress.attempts - 1), RETRY_MAX_SECONDS)
            return
        progress.done = step.index + 1
        progress.last_step_at = now
        progress.attempts, progress.retry_at = 0, None
        if result == "DryRun":
            progress.dry_run_steps.append((step.index, now))

    def forget_policy(self, key: str) -> None:
        """A policy whose spec changed starts afresh: a dry run switched off acts on the workloads idle now
        (warning first), instead of counting the steps the dry run passed as done."""
        for pair in [pair for pair in self.progress if pair[0] == key]:
            del self.progress[pair]

    def observed_idle_seconds(self, uid: str) -> float | None:
        watch = self.watches.get(uid)
        return None if watch is None or watch.stretch is None else watch.observed_seconds

    def save(self) -> dict[str, Any]:
        """The memory as JSON-able data (for the controller's state file)."""
        return {
            "watches": {uid: asdict(watch) for uid, watch in self.watches.items()},
            "progress": [{"policy": policy, "uid": uid, **asdict(progress)}
                         for (policy, uid), progress in self.progress.items()],
        }

    @classmethod
    def restore(cls, saved: Mapping[str, Any]) -> PolicyEvaluator:
        """The memory `save` gave; entries that do not read are left out (they start again)."""
        evaluator = cls()
        for uid, data in (saved.get("watches") or {}).items():
            try:
                evaluator.watches[str(uid)] = Watch(**data)
            except TypeError:
                continue
        for entry in saved.get("progress") or []:
            try:
                data = dict(entry)
                pair = (str(data.pop("policy")), str(data.pop("uid")))
                data["dry_run_steps"] = [(int(index), float(at)) for index, at in data.get("dry_run_steps") or []]
                evaluator.progress[pair] = Progress(**data)
            except (TypeError, KeyError, ValueError):
                continue
        return evaluator
