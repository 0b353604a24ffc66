"""A trace replayed step by step, as the controller's status cycle sees it: idle policies and cost.

`gpuwm replay --policy FILE` evaluates the policies every `step` seconds over the engine's figures of
the trace, exactly as the controller does every status interval (the same `PolicyEvaluator`), and lists
each step a policy would take, with its time; nothing is done, so each counts as done when due (a
dry run's chain). `--pricing FILE` prices each workload and project at the end (`CostMeter`), with
each workload's price per GPU-hour taken from the devices it held, seen every step and just before each
pod event (a pod that ends between two steps still names its devices).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gpuwm.accounting.cost import CostMeter, project_costs
from gpuwm.accounting.engine import Engine
from gpuwm.accounting.policy import Policy, PolicyError, PolicyEvaluator, Subject
from gpuwm.accounting.state import EngineConfig
from gpuwm.config import PricingSettings
from gpuwm.model import NamespaceEvent, PodEvent, SampleEvent, WorkloadEvent

TraceEvents = list[NamespaceEvent | PodEvent | WorkloadEvent | SampleEvent]
POLICY_KINDS = {"GPUIdlePolicy", "ClusterGPUIdlePolicy"}


class ReplayInputError(ValueError):
    """A policy or pricing file that cannot be used; the message names the file and what is wrong."""


def _documents(path: Path) -> list[Any]:
    try:
        return [document for document in yaml.safe_load_all(path.read_text(encoding="utf-8")) if document is not None]
    except OSError as error:
        raise ReplayInputError(f"{path}: cannot read: {error.strerror or error}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ReplayInputError(f"{path}: not YAML or JSON: {error}") from None


def read_policies(path: Path) -> list[Policy]:
    """Every GPUIdlePolicy / ClusterGPUIdlePolicy manifest in a YAML (or JSON) file, in order."""
    policies: list[Policy] = []
    for number, document in enumerate(_documents(path), start=1):
        if not isinstance(document, dict) or document.get("kind") not in POLICY_KINDS:
            raise ReplayInputError(f"{path}: document {number}: not a GPUIdlePolicy or ClusterGPUIdlePolicy")
        metadata = document.get("metadata") or {}
        name = str(metadata.get("name") or f"policy-{number}")
        namespace = str(metadata.get("namespace") or "default") if document["kind"] == "GPUIdlePolicy" else None
        try:
            policies.append(Policy.parse(name, namespace, document.get("spec") or {}))
        except PolicyError as error:
            raise ReplayInputError(f"{path}: {document['kind']} {name}: {error}") from None
    if not policies:
        raise ReplayInputError(f"{path}: holds no policy")
    return policies


def read_pricing(path: Path) -> PricingSettings:
    """The `pricing` object (as the Helm value) of a YAML or JSON file, bare or under a top-level `pricing:`."""
    documents = _documents(path)
    if len(documents) != 1 or not isinstance(documents[0], dict):
        raise ReplayInputError(f"{path}: expected one pricing object")
    found = documents[0].get("pricing", documents[0])
    try:
        return PricingSettings.model_validate(found)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "pricing"
        raise ReplayInputError(f"{path}: pricing.{where}: {first['msg']}") from None


@dataclass(frozen=True)
class TakenStep:
    """A step a policy took in the replay."""

    t: float
    policy: str
    namespace: str
    workload: str
    kind: str
    action: str
    due_at: float
    idle_seconds: float
    dry_run: bool
    via_kueue: bool

    def as_json(self) -> dict[str, Any]:
        return {"t": self.t, "policy": self.policy, "namespace": self.namespace, "workload": self.workload,
                "kind": self.kind, "action": self.action, "dueAt": self.due_at, "idleSeconds": self.idle_seconds,
                "dryRun": self.dry_run, "viaKueue": self.via_kueue}


def _evaluation_times(events: Sequence[Any], at: float, step: float) -> list[float]:
    if not events:
        return [at]
    start = events[0].t
    count = int((at - start) // step)
    times = [start + index * step for index in range(count + 1)]
    if not times or times[-1] < at:
        times.append(at)
    return times


class StepReplay:
    """The engine fed in time order, with the policies evaluated and the devices' prices seen along the way."""

    def __init__(self, config: EngineConfig, policies: Sequence[Policy], meter: CostMeter | None) -> None:
        self.engine = Engine(config)
        self.policies = list(policies)
        self.meter = meter
        self.evaluator = PolicyEvaluator()
        self.taken: list[TakenStep] = []

    def run(self, events: TraceEvents, at: float, step: float) -> None:
        ordered = sorted(events, key=lambda event: event.t)  # stable: file order breaks ties
        pending = [event for event in ordered if event.t <= at]
        position = 0
        for now in _evaluation_times(pending, at, step):
            while position < len(pending) and pending[position].t <= now:
                event = pending[position]
                if isinstance(event, PodEvent) and self.meter is not None:
                    self._see_prices(event.t)
                self.engine.observe(event)
                position += 1
            self._evaluate(now)

    def _see_prices(self, now: float) -> None:
        assert self.meter is not None
        for figures in self.engine.workloads(now):
            if figures.gpus:
                self.meter.rate(figures)

    def _evaluate(self, now: float) -> None:
        workloads = self.engine.workloads(now)
        if self.meter is not None:
            for figures in workloads:
                self.meter.rate(figures)
        if not self.policies:
            return
        subjects = [Subject(figures=figures, reporting=figures.sampling) for figures in workloads]
        steps, _ = self.evaluator.evaluate(self.policies, subjects, now)
        for due in steps:
            self.taken.append(TakenStep(t=now, policy=due.policy, namespace=due.namespace, workload=due.name,
                                        kind=due.kind, action=due.action, due_at=due.due_at,
                                        idle_seconds=due.idle_seconds, dry_run=due.dry_run, via_kueue=due.via_kueue))
            self.evaluator.record(due, "DryRun" if due.dry_run else "Succeeded", now)


def priced_report(replayed: StepReplay, at: float) -> dict[str, Any]:
    """The report at `at` as `gpuwm replay` prints it, with cost figures where a meter priced it."""
    workloads, projects, _cluster = replayed.engine.report(at)
    workload_rows = [figures.model_dump(by_alias=True, exclude={"uid"}) for figures in workloads]
    project_rows = [figures.model_dump(by_alias=True) for figures in projects]
    meter = replayed.meter
    if meter is not None:
        costs = [(figures, meter.workload(figures)) for figures in workloads]
        for row, (_figures, cost) in zip(workload_rows, costs, strict=True):
            row.update({"pricePerGpuHour": cost.price_per_gpu_hour, "costPerHour": cost.cost_per_hour,
                        "cost": cost.cost, "idleCost": cost.idle_cost, "energyCost": cost.energy_cost})
        sums = project_costs(projects, costs)
        for row, project in zip(project_rows, projects, strict=True):
            total = sums[project.name]
            row.update({"costPerHour": total.cost_per_hour, "cost": total.cost, "idleCost": total.idle_cost,
                        "idleCostPerHour": total.idle_cost_per_hour, "energyCost": total.energy_cost})
    report: dict[str, Any] = {"at": at, "workloads": workload_rows, "projects": project_rows}
    if meter is not None:
        report["currency"] = meter.currency
    if replayed.policies:
        report["actions"] = [taken.as_json() for taken in replayed.taken]
    return report


def replay_in_steps(events: TraceEvents, config: EngineConfig, policies: Iterable[Policy],
                    pricing: PricingSettings | None, at: float | None, step: float) -> dict[str, Any]:
    """`gpuwm replay` with `--policy` or `--pricing`: the report at `at` (default the last event's time)."""
    if at is None:
        at = max((event.t for event in events), default=0.0)
    replayed = StepReplay(config, list(policies), CostMeter(pricing) if pricing is not None else None)
    replayed.run(events, at, step)
    return priced_report(replayed, at)
