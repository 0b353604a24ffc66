"""`GET /api/v1/queue`: the workloads waiting for GPUs, longest wait first.

The question a platform team asks right after "who is wasting GPUs" is "who is waiting for them,
for how long, and for how many": the Queued workloads (held back: suspended, or not admitted by
Kueue) and the Pending ones (admitted, no GPU container running yet), from the latest figures.
The same reads and the same authorisation as the workload list: a caller sees the namespaces it
may read, and a namespace filter it may not read is a 403. The route is in gpuwm.api.routes.workloads.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from gpuwm.model import WorkloadFigures

#: the phases of a workload waiting for its GPUs, in the order a tie on wait is listed
WAITING_PHASES = ("Queued", "Pending")


class QueueView(BaseModel):
    """The waiting workloads, longest wait first, and what they add up to."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    workloads: list[WorkloadFigures] = Field(
        description="Queued and Pending workloads by waitSeconds, longest first (then namespace and name)."
    )
    queued: int = Field(description="How many of them are Queued (held back).")
    pending: int = Field(description="How many are Pending (admitted, no GPU container running yet).")
    requested_gpus: float = Field(description="GPU units they ask for in all: demand not met now.")
    longest_wait_seconds: float = Field(description="The first one's waitSeconds (0 when none waits).")


def queue_order(workload: WorkloadFigures) -> tuple[float, int, str, str]:
    """Longest wait first; on a tie Queued before Pending, then by namespace and name."""
    return -workload.wait_seconds, WAITING_PHASES.index(workload.phase), workload.namespace, workload.name


def queue_view(workloads: list[WorkloadFigures]) -> QueueView:
    waiting = sorted((w for w in workloads if w.phase in WAITING_PHASES), key=queue_order)
    return QueueView(
        workloads=waiting,
        queued=sum(1 for w in waiting if w.phase == "Queued"),
        pending=sum(1 for w in waiting if w.phase == "Pending"),
        requested_gpus=sum(w.requested_gpus or 0.0 for w in waiting),
        longest_wait_seconds=waiting[0].wait_seconds if waiting else 0.0,
    )
