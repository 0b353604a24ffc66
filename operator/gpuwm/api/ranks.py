"""Ranks of a distributed workload's pods, for `by=rank`, `leader=true` and the `rank` label on pod series.

Users of Baseten and ModelArts address a job's tasks by rank (`worker-0`, the leader as the multinode
default). The figures carry each pod's name, not its labels, so the rank is read from the names the
operators give their pods: Kubeflow `<job>-<replica type>-<index>`, JobSet `<jobset>-<job>-<job index>-
<pod index>-<suffix>`, an indexed Job `<job>-<completion index>-<suffix>`, Ray `<cluster>-head-<suffix>`
and `<cluster>-<group>-worker-<suffix>`. The leader role (master, chief, launcher, head) comes first,
then workers by their indices, then other roles (ps, evaluator) and pods with no index, by name: rank 0
is the leader where there is one, else the lowest index, else the first pod by name.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

#: replica types whose pod leads the job (Kubeflow master/chief, MPI launcher, Ray head)
LEADER_ROLES = ("master", "chief", "launcher", "head")
_ROLE = re.compile(r"-(master|chief|launcher|head|worker|ps|evaluator)(?:-|$)")
_INDICES = re.compile(r"-(\d+)")
_SUFFIX = re.compile(r"-[a-z0-9]{5}$")  # the random suffix of a generated pod name


@dataclass(frozen=True)
class Rank:
    pod: str
    rank: int
    role: str


def _rest(name: str, workload: str) -> str:
    """The part of the pod's name after its workload's, from a dash (the role and indices are in it)."""
    return name[len(workload):] if name.startswith(workload) else "-" + name


def _order(name: str, workload: str) -> tuple[int, tuple[int, ...], str]:
    rest = _rest(name, workload)
    found = _ROLE.search(rest)
    role = found.group(1) if found else ""
    group = 0 if role in LEADER_ROLES else 1 if role in ("worker", "") else 2
    text = _SUFFIX.sub("", rest) if not rest.rsplit("-", 1)[-1].isdigit() else rest
    indices = tuple(int(index) for index in _INDICES.findall(text))
    return group, indices, name


def rank_pods(workload: str, pods: Sequence[str]) -> list[Rank]:
    """The pods of workload `workload` in rank order, each with its rank and role ("" where none is named)."""
    ordered = sorted(dict.fromkeys(pods), key=lambda name: _order(name, workload))
    ranks = []
    for rank, name in enumerate(ordered):
        found = _ROLE.search(_rest(name, workload))
        ranks.append(Rank(pod=name, rank=rank, role=found.group(1) if found else ""))
    return ranks
