"""The CR statuses a status cycle offers the writer, each rendered only when it is sent.

Every cycle offers every workload's and project's CR to the `StatusWriter`, which keeps only what
is worth a write and drains it at a bounded rate. An offer carries what the writer decides by (hashes
of the CR's signature and counters: only their equality counts) and a `render` that builds the status
at the moment of the write, so a cycle that offers thousands of CRs builds the few the rate lets
through. A finished workload's figures are final: they are offered once, not every cycle.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, NamedTuple

from gpuwm.config import Settings
from gpuwm.controller.policy import PolicyRoom
from gpuwm.controller.state import ControllerState, with_baseline
from gpuwm.controller.status import (
    PROJECT_PLURAL,
    WORKLOAD_PLURAL,
    ConditionStatus,
    Desired,
    Seen,
    StatusWriter,
    build_project_status,
    build_workload_status,
    claim_cr_name,
    dns_name,
    label_value,
    project_counters,
    project_signature,
    remembered,
    workload_counters,
    workload_labels,
    workload_signature,
)
from gpuwm.model import ProjectFigures, WorkloadFigures


class CrStatic(NamedTuple):
    """What a workload's CR holds besides its status; it changes only with `held`."""

    #: the workload's project, Kueue local queue and cluster queue
    held: tuple[str, str | None, str | None]
    spec: dict[str, Any]
    labels: dict[str, str]


def cr_static(figures: WorkloadFigures) -> CrStatic:
    """The spec and labels of a workload's CR."""
    spec = {
        "workloadRef": {"apiVersion": figures.api_version, "kind": figures.kind, "name": figures.name,
                        "uid": figures.uid},
        "project": figures.project,
    }
    return CrStatic((figures.project, figures.local_queue, figures.cluster_queue), spec, workload_labels(figures))


class StatusOffers:
    """Offers the CRs of each cycle's figures to `writer`; what it remembers between cycles is not saved."""

    def __init__(self, settings: Settings, writer: StatusWriter) -> None:
        self.settings = settings
        self.writer = writer
        #: workload uid -> its CR's spec and labels, built once rather than for each CR each cycle
        self._static: dict[str, CrStatic] = {}
        #: workload uid -> the settled figures last offered (the engine's own cached object)
        self.offered_settled: dict[str, WorkloadFigures] = {}

    def forget(self, uid: str) -> None:
        """Retention removed the workload and its CR."""
        self._static.pop(uid, None)
        self.offered_settled.pop(uid, None)

    def offer_workloads(self, state: ControllerState, workloads: list[WorkloadFigures], now: float, *,
                        slack_seconds: float, policies: PolicyRoom | None = None,
                        idle: Mapping[str, tuple[ConditionStatus, str]] | None = None,
                        seen: Mapping[str, Seen] | None = None) -> None:
        """Each workload's CR to the writer. `slack_seconds`: see `idleness.reporting`; `idle`, `seen`: each
        one's Idle condition and `seen_now`, where this cycle computed them."""
        for figures in workloads:
            settled = state.engine.settled_figures(figures.uid) is figures
            if settled and self.offered_settled.get(figures.uid) is figures:
                continue  # a finished workload's unchanged figures: the writer has them already
            name = claim_cr_name(figures, state.cr_names, state.cr_owner)
            if name is None:
                continue
            if settled:
                self.offered_settled[figures.uid] = figures
            else:
                self.offered_settled.pop(figures.uid, None)
            static = self._static.get(figures.uid)
            if static is None or static.held != (figures.project, figures.local_queue, figures.cluster_queue):
                static = self._static[figures.uid] = cr_static(figures)
            observed_idle = state.observed_idle.get(figures.uid)
            signature = workload_signature(
                figures, now, idle_condition_after_seconds=self.settings.idle_condition_after,
                underutilized_percent=self.settings.underutilized_percent, observed_idle_seconds=observed_idle,
                reporting_slack_seconds=slack_seconds, idle=None if idle is None else idle.get(figures.uid),
                seen=None if seen is None else seen.get(figures.uid),
            )
            if policies is not None:  # what the policy room adds to the status is news too
                signature = (*signature, policies.signature(figures.uid))
            self.writer.offer(Desired(
                plural=WORKLOAD_PLURAL, namespace=figures.namespace, name=name, spec=static.spec, labels=static.labels,
                # a running workload's figures are computed again at its write; a settled one's are final
                render=functools.partial(self._render_workload, state, figures.uid, now, observed_idle, slack_seconds,
                                         figures if settled else None, policies),
                signature=hash(signature), counters=hash(workload_counters(figures)),
                # a settled workload's figures are final, no sample is behind them: not a sample -> status lag
                sample_time=None if settled else state.latest_sample_time,
            ))

    def _render_workload(self, state: ControllerState, uid: str, now: float, observed_idle_seconds: float | None,
                         slack_seconds: float, settled: WorkloadFigures | None,
                         policies: PolicyRoom | None) -> dict[str, Any]:
        """The status a write sends; conditions keep their transition times across writes.

        `settled`: a finished workload's final figures, which the engine keeps anyway. A running
        workload's figures are computed again here from the window sums the engine keeps
        (`Engine.workload`), for the few CRs the writer's rate lets through, instead of holding
        every offered workload's figures until its turn.
        """
        figures = settled
        if figures is None:
            engine_figures = state.engine.workload(uid, now)
            if engine_figures is None:  # retention forgets the CR with the workload, so this is not expected
                raise LookupError(f"workload {uid} is no longer in the engine; its GPUWorkloadMetrics is not rendered")
            figures = with_baseline(engine_figures, state.baselines)
        status = build_workload_status(
            figures, now,
            idle_condition_after_seconds=self.settings.idle_condition_after,
            underutilized_percent=self.settings.underutilized_percent,
            previous_conditions=state.conditions.get(figures.uid, ()),
            observed_idle_seconds=observed_idle_seconds, reporting_slack_seconds=slack_seconds,
        )
        state.conditions[figures.uid] = remembered(status.conditions)
        body = status.model_dump(mode="json", by_alias=True)
        if policies is not None:
            policies.decorate_workload(figures, body)
        return body

    def offer_projects(self, state: ControllerState, projects: list[ProjectFigures], now: float,
                       policies: PolicyRoom | None = None) -> None:
        """Each project's GPUProjectMetrics to the writer."""
        for figures in projects:
            self.writer.offer(Desired(
                plural=PROJECT_PLURAL, namespace=None, name=dns_name(figures.name),
                spec={"project": figures.name}, labels={"gpuwm.io/project": label_value(figures.name)},
                render=functools.partial(_project_body, figures, now, policies),
                signature=hash(project_signature(figures)), counters=hash(project_counters(figures)),
                sample_time=state.latest_sample_time,
            ))


def _project_body(figures: ProjectFigures, now: float, policies: PolicyRoom | None) -> dict[str, Any]:
    """The GPUProjectMetrics status a write sends (with its cost, where priced)."""
    body = build_project_status(figures, now).model_dump(mode="json", by_alias=True)
    if policies is not None:
        policies.decorate_project(figures.name, body)
    return body
