"""Simulated workloads: what each kind asks for, how long it lives, and how hard it uses its GPUs.

Four kinds, the mix that makes GPU accounting interesting:

- training (PyTorchJob): whole GPUs, busy at 80-100 % with stalls (checkpoints, data loading)
- batch (Job): whole GPUs, often waits in the queue for capacity, busy while it runs
- notebook (Notebook): one MIG slice, time-sliced share or GPU; idle most of the time
- inference (Deployment): a share or a GPU per replica; load follows the time of day

Training and batch jobs go through a simulated Kueue: created suspended (no pods), admitted when
the simulator can place them, suspended again when preempted (their pods deleted) and admitted
again later; one in `UNREACHABLE_EVERY` waits in a ClusterQueue with no quota and is never
admitted. gpuwm watches every kind's object but the Notebook's (a kind outside its default list),
whose workload it knows from its pods alone.

`demand` is in percent of what the pod holds (its share), the figure DESIGN §3 calls the
workload's utilisation; the simulator turns it into device and per-process SM %.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Literal

from gpuwm.sim.fleet import Device, NodeKind

WorkloadKind = Literal["training", "batch", "notebook", "inference"]

#: (namespace, project label on the namespace or None: then the namespace name is the project)
NAMESPACES: dict[WorkloadKind, tuple[tuple[str, str | None], ...]] = {
    "training": (("vision-research", "vision"), ("nlp-pretrain", "nlp"), ("ml-platform", None)),
    "batch": (("vision-research", "vision"), ("recsys", "recsys"), ("ml-platform", None)),
    "notebook": (("notebooks", "research"), ("vision-research", "vision"), ("nlp-pretrain", "nlp")),
    "inference": (("nlp-serving", "nlp"), ("recsys", "recsys"), ("vision-prod", "vision")),
}
ALL_NAMESPACES: tuple[tuple[str, str | None], ...] = tuple(
    sorted({entry for entries in NAMESPACES.values() for entry in entries}, key=lambda entry: entry[0])
)
_NAMES: dict[WorkloadKind, tuple[str, ...]] = {
    "training": ("llm-pretrain", "resnet-finetune", "vit-sweep", "bert-distill", "diffusion-train", "rl-ppo"),
    "batch": ("embed-backfill", "eval-suite", "feature-extract", "batch-score", "video-transcode"),
    "notebook": ("alice-nb", "bob-nb", "carol-nb", "dmitri-nb", "eve-nb", "farah-nb"),
    "inference": ("chat-api", "ranker", "embedder", "ocr-service", "reranker", "asr-stream"),
}
_OWNER: dict[WorkloadKind, tuple[str, str]] = {
    "training": ("kubeflow.org/v1", "PyTorchJob"),
    "batch": ("batch/v1", "Job"),
    "notebook": ("kubeflow.org/v1", "Notebook"),
    "inference": ("apps/v1", "Deployment"),
}
_WEIGHTS: dict[WorkloadKind, float] = {"training": 0.3, "batch": 0.35, "notebook": 0.2, "inference": 0.15}
#: the kinds Kueue admits (created suspended); the kinds whose objects gpuwm watches
KUEUE_KINDS: frozenset[WorkloadKind] = frozenset({"training", "batch"})
WATCHED_KINDS: frozenset[WorkloadKind] = frozenset({"training", "batch", "inference"})
#: every this many workloads (by serial), a Kueue one goes to the ClusterQueue without quota: never admitted
UNREACHABLE_EVERY = 12
#: that ClusterQueue's name
UNREACHABLE_QUEUE = "reserved-h100"


@dataclass(frozen=True)
class Request:
    """What each pod of a workload needs: `count` devices of a node kind (a MIG profile for MIG)."""

    node_kind: NodeKind
    count: int
    pods: int
    mig_profile: str | None = None


@dataclass
class SimPod:
    uid: str
    name: str
    memory_fraction: float  # of each device's memory, held while running
    cpu_cores: float
    pid: int
    devices: list[Device] = field(default_factory=list)
    node: str | None = None


@dataclass
class SimWorkload:
    """One workload and the state of its activity model."""

    uid: str
    kind: WorkloadKind
    namespace: str
    name: str
    api_version: str
    owner_kind: str
    labels: dict[str, str]
    request: Request
    created: float
    duration_seconds: float
    pods: list[SimPod] = field(default_factory=list)
    started: float | None = None
    ended: float | None = None
    fails: bool = False
    busy_percent: float = 90.0
    quiet_until: float = -math.inf  # training/batch: stalled until; notebook: bursting until
    demand_percent: float = 0.0  # this step's utilisation of its share
    #: Kueue's queues when Kueue admits it (created suspended), else None
    local_queue: str | None = None
    cluster_queue: str | None = None
    watched: bool = False  # gpuwm watches the object itself, not only its pods
    suspended: bool = False  # held back by Kueue now (before admission, or preempted)
    ran_seconds: float = 0.0  # run time of its earlier runs (before preemptions)
    requeue_at: float = -math.inf  # preempted: not admitted again before this time (Kueue's backoff)
    preemptions: int = 0
    runs: int = 0  # times placed (admitted) and run

    @property
    def running(self) -> bool:
        return self.started is not None and self.ended is None

    @property
    def admissible(self) -> bool:
        """Kueue may admit it (its ClusterQueue has quota); always so for workloads outside Kueue."""
        return self.cluster_queue != UNREACHABLE_QUEUE

    def step_demand(self, t: float, dt: float, rng: random.Random) -> None:
        """The workload's utilisation of its share over (t - dt, t]; 0 or at least 5 (clear of any threshold)."""
        demand = 0.0
        if self.kind in ("training", "batch"):
            stall_every_seconds = 600.0 if self.kind == "training" else 1800.0
            if t < self.quiet_until:
                demand = 0.0
            elif rng.random() < dt / stall_every_seconds:
                self.quiet_until = t + rng.uniform(20.0, 150.0)
            else:
                demand = rng.gauss(self.busy_percent, 5.0)
        elif self.kind == "notebook":
            if t < self.quiet_until:
                demand = max(5.0, rng.gauss(45.0, 20.0))
            elif rng.random() < dt / 2400.0:
                self.quiet_until = t + rng.uniform(60.0, 600.0)
        else:  # inference: diurnal, peak mid-afternoon (UTC), no traffic at night
            hour = (t % 86400.0) / 3600.0
            load = 0.5 + 0.5 * math.sin(2.0 * math.pi * (hour - 8.0) / 24.0)
            demand = self.busy_percent * load + rng.gauss(0.0, 4.0) - 10.0
            if demand < 3.0:
                demand = 0.0
        demand = min(100.0, max(5.0, demand)) if demand > 0.0 else 0.0
        self.demand_percent = round(demand, 1)

    def device_percent(self, rng: random.Random) -> float:
        """One device's utilisation this step: the workload's demand with per-device noise."""
        if self.demand_percent <= 0.0:
            return 0.0
        return round(min(100.0, max(5.0, self.demand_percent + rng.gauss(0.0, 2.0))), 1)


def pick_kind(rng: random.Random) -> WorkloadKind:
    return rng.choices(list(_WEIGHTS), weights=list(_WEIGHTS.values()))[0]


def _request(kind: WorkloadKind, rng: random.Random, available: set[NodeKind], gpus_per_node: int) -> Request:
    def choose(options: list[tuple[NodeKind, float]]) -> NodeKind:
        usable = [(node_kind, weight) for node_kind, weight in options if node_kind in available]
        if not usable:
            return "whole"
        return rng.choices([k for k, _ in usable], weights=[w for _, w in usable])[0]

    if kind == "training":
        count = min(gpus_per_node, rng.choice((1, 2, 4, 8, 8)))
        pods = 2 if count == gpus_per_node and rng.random() < 0.3 else 1
        return Request("whole", count, pods)
    if kind == "batch":
        return Request("whole", min(gpus_per_node, rng.choice((1, 1, 2, 4))), 1)
    node_kind = choose([("mig", 0.6), ("shared", 0.25), ("whole", 0.15)] if kind == "notebook"
                       else [("shared", 0.5), ("whole", 0.3), ("mig", 0.2)])
    profile = rng.choice(("1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb")) if node_kind == "mig" else None
    pods = 1 if kind == "notebook" else rng.choice((1, 1, 2))
    return Request(node_kind, 1, pods, profile)


def _duration_seconds(kind: WorkloadKind, rng: random.Random) -> float:
    if kind == "training":
        return rng.uniform(1800.0, 6 * 3600.0)
    if kind == "batch":
        return rng.uniform(300.0, 2700.0)
    if kind == "notebook":
        return rng.uniform(3600.0, 8 * 3600.0)
    return rng.uniform(2 * 86400.0, 5 * 86400.0)


def new_workload(
    rng: random.Random, uid: str, pod_uids: list[str], serial: int, created: float,
    kind: WorkloadKind, available: set[NodeKind], gpus_per_node: int,
) -> SimWorkload:
    """A workload of `kind` created at `created`, with its pods (not yet placed)."""
    request = _request(kind, rng, available, gpus_per_node)
    namespace, _project = rng.choice(NAMESPACES[kind])
    labels = {"app.kubernetes.io/name": _NAMES[kind][serial % len(_NAMES[kind])]}
    if namespace == "recsys" and rng.random() < 0.3:
        labels["gpuwm.io/project"] = "ads"  # a pod label overrides the namespace's project
    name = f"{_NAMES[kind][serial % len(_NAMES[kind])]}-{serial:04d}"
    api_version, owner_kind = _OWNER[kind]
    local_queue = cluster_queue = None
    if kind in KUEUE_KINDS:  # names only, no draws: a seed's other draws do not depend on Kueue
        local_queue = f"{namespace}-gpus"
        cluster_queue = UNREACHABLE_QUEUE if serial % UNREACHABLE_EVERY == UNREACHABLE_EVERY // 2 else "whole-gpus"
    workload = SimWorkload(
        uid=uid, kind=kind, namespace=namespace, name=name, api_version=api_version, owner_kind=owner_kind,
        labels=labels, request=request, created=created, duration_seconds=_duration_seconds(kind, rng),
        fails=kind in ("training", "batch") and rng.random() < 0.05,
        busy_percent=rng.uniform(78.0, 97.0) if kind != "inference" else rng.uniform(60.0, 95.0),
        local_queue=local_queue, cluster_queue=cluster_queue, watched=kind in WATCHED_KINDS,
        suspended=kind in KUEUE_KINDS,
    )
    suffix = "".join(rng.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))
    for index in range(request.pods):
        pod_name = {
            "training": f"{name}-worker-{index}",
            "batch": f"{name}-{suffix}",
            "notebook": f"{name}-{index}",
            "inference": f"{name}-7d9f8c6b5-{suffix[:4]}{index}",
        }[kind]
        memory = {"training": (0.7, 0.95), "batch": (0.5, 0.9), "notebook": (0.1, 0.5), "inference": (0.3, 0.6)}[kind]
        cores = {"training": (6.0, 14.0), "batch": (2.0, 8.0), "notebook": (0.1, 1.0), "inference": (1.0, 4.0)}[kind]
        workload.pods.append(SimPod(
            uid=pod_uids[index], name=pod_name, memory_fraction=rng.uniform(*memory),
            cpu_cores=rng.uniform(*cores), pid=rng.randrange(1000, 4_000_000),
        ))
    return workload
