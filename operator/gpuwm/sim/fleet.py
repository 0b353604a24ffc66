"""The simulated hardware: nodes, GPUs, and the schedulable devices each GPU offers.

A node is one of three kinds, like the GPU nodes clusters really mix:
whole GPUs (H100, one pod per GPU), MIG-partitioned GPUs (A100 split into 3g/2g/1g
instances, each held whole by one pod) and time-sliced GPUs (L4 shared by `replicas`
pods, each holding `GPU-x::k`, 1/replicas of a unit).
"""

from __future__ import annotations

import random
import uuid as uuid_module
from dataclasses import dataclass, field
from typing import Literal

NodeKind = Literal["whole", "mig", "shared"]

GIB = 1024.0**3


@dataclass(frozen=True)
class GpuProduct:
    """What a product reports through NVML (the figures a sample carries)."""

    model: str
    memory_total_bytes: float
    power_limit_watts: float
    idle_power_watts: float
    max_sm_clock_mhz: float
    idle_sm_clock_mhz: float
    memory_clock_mhz: float


H100 = GpuProduct("NVIDIA H100 80GB HBM3", 80.0 * GIB, 700.0, 70.0, 1980.0, 345.0, 2619.0)
A100 = GpuProduct("NVIDIA A100-SXM4-80GB", 80.0 * GIB, 400.0, 55.0, 1410.0, 210.0, 1593.0)
L4 = GpuProduct("NVIDIA L4", 24.0 * GIB, 72.0, 16.0, 2040.0, 210.0, 6251.0)

#: MIG layout of each partitioned A100: (profile, compute slices of 7, memory GiB)
MIG_LAYOUT: tuple[tuple[str, int, float], ...] = (("3g.40gb", 3, 40.0), ("2g.20gb", 2, 20.0), ("1g.10gb", 1, 10.0), ("1g.10gb", 1, 10.0))
MIG_SLICES = 7
#: time-slicing replicas per shared GPU (the device plugin's `replicas`)
SHARED_REPLICAS = 4


@dataclass
class Device:
    """A schedulable device: a whole GPU, a MIG instance, or one time-sliced replica.

    `uuid` is what the pod holds (`GPU-x::k` for a replica); `sample_uuid` is the device
    that samples describe (the physical GPU for a replica, the instance for MIG).
    """

    uuid: str
    sample_uuid: str
    units: float
    gpu: Gpu
    mig_profile: str | None = None
    memory_total_bytes: float = 0.0
    holder: str | None = None  # pod uid


@dataclass
class Gpu:
    """One physical GPU and the devices it offers."""

    node: Node
    index: int
    uuid: str
    product: GpuProduct
    energy_joules: float
    devices: list[Device] = field(default_factory=list)
    lost: bool = False

    @property
    def kind(self) -> NodeKind:
        return self.node.kind


@dataclass
class Node:
    name: str
    kind: NodeKind
    gpus: list[Gpu] = field(default_factory=list)
    #: its agent sees no process (a DaemonSet without hostPID, processes in another PID namespace): every
    #: sample's process list is empty, however busy the GPU (DESIGN §3's attribution rule must hold)
    hides_processes: bool = False


def hides_processes(index: int, nodes: int) -> bool:
    """One whole-GPU node in eight and one time-sliced node in sixteen; node 0 of a 4 to 7 node fleet."""
    if nodes >= 8:
        return index % 8 == 5 or (nodes >= 16 and index % 16 == 15)
    return nodes >= 4 and index == 0


def node_kinds(nodes: int) -> list[NodeKind]:
    """Mostly whole-GPU nodes, one in eight MIG and one in eight time-sliced (at least one each from 3 nodes)."""
    kinds: list[NodeKind] = []
    for index in range(nodes):
        if nodes < 8:
            if nodes >= 3 and index == nodes - 2:
                kinds.append("mig")
            elif nodes >= 2 and index == nodes - 1:
                kinds.append("shared")
            else:
                kinds.append("whole")
        else:
            kinds.append("mig" if index % 8 == 6 else "shared" if index % 8 == 7 else "whole")
    return kinds


def node_names(nodes: int) -> list[str]:
    """`sim-node-000` ... (zero-padded so they sort)."""
    width = max(3, len(str(nodes - 1)))
    return [f"sim-node-{index:0{width}d}" for index in range(nodes)]


def random_uuid(rng: random.Random) -> str:
    return str(uuid_module.UUID(int=rng.getrandbits(128), version=4))


def build_fleet(rng: random.Random, nodes: int, gpus_per_node: int) -> list[Node]:
    """`nodes` nodes of `gpus_per_node` GPUs with UUIDs drawn from `rng` (so a seed fixes them)."""
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError(f"a fleet needs at least one node and one GPU per node (got {nodes} x {gpus_per_node})")
    fleet: list[Node] = []
    for index, (name, kind) in enumerate(zip(node_names(nodes), node_kinds(nodes), strict=True)):
        node = Node(name=name, kind=kind, hides_processes=hides_processes(index, nodes))
        product = {"whole": H100, "mig": A100, "shared": L4}[kind]
        for gpu_index in range(gpus_per_node):
            gpu = Gpu(
                node=node,
                index=gpu_index,
                uuid="GPU-" + random_uuid(rng),
                product=product,
                energy_joules=float(rng.randrange(10_000_000, 900_000_000)),
            )
            if kind == "whole":
                gpu.devices.append(Device(gpu.uuid, gpu.uuid, 1.0, gpu, memory_total_bytes=product.memory_total_bytes))
            elif kind == "mig":
                for profile, slices, memory_gib in MIG_LAYOUT:
                    instance = "MIG-" + random_uuid(rng)
                    gpu.devices.append(
                        Device(instance, instance, slices / MIG_SLICES, gpu, mig_profile=profile,
                               memory_total_bytes=memory_gib * GIB)
                    )
            else:
                gpu.devices += [Device(f"{gpu.uuid}::{replica}", gpu.uuid, 1.0 / SHARED_REPLICAS, gpu,
                                       memory_total_bytes=product.memory_total_bytes)
                                for replica in range(SHARED_REPLICAS)]
            node.gpus.append(gpu)
        fleet.append(node)
    return fleet
