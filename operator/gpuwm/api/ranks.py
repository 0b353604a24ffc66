"""Ranks of a distributed workload's pods, for `by=rank`, `leader=true` and the `rank` label on pod series.

Users of Baseten and ModelArts address a job's tasks by rank (`worker-0`, the leader as the multinode
default). The operators say which replica a pod is in its labels, which the controller keeps on the
pod's figures whatever `labels_kept` says (controller/watch/pods.py RANK_LABELS): Kubeflow
`training.kubeflow.org/replica-type` and `replica-index`, an indexed Job's
`batch.kubernetes.io/job-completion-index`, JobSet's `jobset.sigs.k8s.io/replicatedjob-name` and
`job-index` (its pods' completion index within the job after it), Ray's `ray.io/node-type` head/worker.
The labels are read first because a pod's name is the operator's choice and may say nothing (a
generated name, a renamed template); a pod without them is ranked from the name the operators give:
Kubeflow `<job>-<replica type>-<index>`, JobSet `<jobset>-<job>-<job index>-<pod index>-<suffix>`, an
indexed Job `<job>-<completion index>-<suffix>`, Ray `<cluster>-head-<suffix>` and
`<cluster>-<group>-worker-<suffix>`. The leader role (master, chief, launcher, head) comes first, then
workers (a JobSet's by replicated job) by their indices, then other roles (ps, evaluator); pods that
neither ranks apart go by name, the order of the figures: rank 0 is the leader where there is one, else
the lowest index, else the first pod by name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

#: replica types whose pod leads the job (Kubeflow master/chief, MPI launcher, Ray head)
LEADER_ROLES = ("master", "chief", "launcher", "head")
_ROLE = re.compile(r"-(master|chief|launcher|head|worker|ps|evaluator)(?:-|$)")
_INDICES = re.compile(r"-(\d+)")
_SUFFIX = re.compile(r"-[a-z0-9]{5}$")  # the random suffix of a generated pod name

KUBEFLOW_TYPE = "training.kubeflow.org/replica-type"
KUBEFLOW_INDEX = "training.kubeflow.org/replica-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOBSET_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOBSET_INDEX = "jobset.sigs.k8s.io/job-index"
RAY_NODE_TYPE = "ray.io/node-type"


class _Key(NamedTuple):
    """Where a pod sorts: leaders, then workers, then other roles; by replicated job, indices, then name."""

    group: int
    job: str
    indices: tuple[int, ...]
    pod: str


@dataclass(frozen=True)
class Rank:
    pod: str
    rank: int
    role: str


def _rest(name: str, workload: str) -> str:
    """The part of the pod's name after its workload's, from a dash (the role and indices are in it)."""
    return name[len(workload):] if name.startswith(workload) else "-" + name


def _group(role: str) -> int:
    return 0 if role in LEADER_ROLES else 1 if role in ("worker", "") else 2


def _index(labels: Mapping[str, str], key: str) -> tuple[int, ...]:
    value = labels.get(key, "")
    return (int(value),) if value.isdigit() else ()


def _from_labels(labels: Mapping[str, str] | None) -> tuple[str, tuple[int, ...], str] | None:
    """(role, indices, the replicated job a JobSet pod is in) from the operators' labels; None without them."""
    if not labels:
        return None
    if KUBEFLOW_TYPE in labels:
        return labels[KUBEFLOW_TYPE].lower(), _index(labels, KUBEFLOW_INDEX), ""
    if RAY_NODE_TYPE in labels:
        return labels[RAY_NODE_TYPE].lower(), (), ""
    if JOBSET_INDEX in labels:
        return "", _index(labels, JOBSET_INDEX) + _index(labels, COMPLETION_INDEX), labels.get(JOBSET_JOB, "")
    if COMPLETION_INDEX in labels:
        return "", _index(labels, COMPLETION_INDEX), ""
    return None


def _role_and_key(name: str, workload: str, labels: Mapping[str, str] | None) -> tuple[str, _Key]:
    found = _from_labels(labels)
    if found is not None:
        role, indices, job = found
        return role, _Key(_group(role), job, indices, name)
    rest = _rest(name, workload)
    matched = _ROLE.search(rest)
    role = matched.group(1) if matched else ""
    text = _SUFFIX.sub("", rest) if not rest.rsplit("-", 1)[-1].isdigit() else rest
    return role, _Key(_group(role), "", tuple(int(index) for index in _INDICES.findall(text)), name)


def rank_pods(
    workload: str, pods: Sequence[str], labels: Mapping[str, Mapping[str, str] | None] | None = None
) -> list[Rank]:
    """The pods of workload `workload` in rank order, each with its rank and role ("" where none is named).

    `labels`: each pod's labels by name (its figures' `labels`); a pod's rank labels outrank its name."""
    given = labels or {}
    keyed = sorted((_role_and_key(name, workload, given.get(name)) for name in dict.fromkeys(pods)),
                   key=lambda role_and_key: role_and_key[1])
    return [Rank(pod=key.pod, rank=rank, role=role) for rank, (role, key) in enumerate(keyed)]
