"""`model_json` writes pydantic's own bytes for the figures the store keeps as JSON.

The store compares each row's JSON with what it wrote last (a digest) and the API reads it with
`model_validate_json`: the bytes must be `model_dump_json`'s, floats, NaN and non-ASCII included.
"""

from __future__ import annotations

import math

import pytest

from gpuwm.model.figures import (
    ClusterFigures,
    GpuFigures,
    PodFigures,
    ProjectFigures,
    Windows,
    WorkloadFigures,
)
from gpuwm.model.jsonfast import model_json

_ODD_FLOATS = [0.0, -0.0, 1e-7, 1 / 3, 0.1 + 0.2, 400.123, 1.5e9, 12345678901234.5, 1e16, 1e22, 2.0**53 + 2,
               math.nan, math.inf]


def _workload(value: float) -> WorkloadFigures:
    return WorkloadFigures(
        uid="u-1", namespace="équipe", name='job "x"\n\\', kind="PyTorchJob", api_version="kubeflow.org/v1",
        project="projet-\u2014", phase="Running", allocated_gpus=1 / 7, allocated_gpu_seconds=value,
        idle_gpu_seconds=value, last_active_time=None, energy_joules=value,
        utilization=Windows(current=value, avg1m=None, avg5m=value, lifetime=1 / 3),
        nodes=["node-ü", "n2"], pods=[PodFigures(name="p", uid="pu", phase="Running", allocated_gpus=value)],
        gpus=[GpuFigures(node="n", uuid="MIG-1", mig_profile="1g.10gb", device_units=1 / 7, units=value,
                         memory_used_bytes=value, healthy=False, error="NVMLError_GpuIsLost: \u2014 \"lost\""),
              GpuFigures(node="n", uuid="GPU-2")],
    )


@pytest.mark.parametrize("value", _ODD_FLOATS)
def test_figures_json_is_model_dump_json(value: float) -> None:
    workload = _workload(value)
    for model in (workload, workload.model_copy(update={"idle_gpu_seconds": value + 1.0, "start_time": 5.0}),
                  ProjectFigures(name="p", namespaces=["a"], quota=value, energy_joules=value),
                  ClusterFigures(gpus=3, total_gpu_units=value, memory_utilization=Windows(avg1h=value))):
        assert model_json(model) == model.model_dump_json().encode()


def test_model_json_refuses_what_it_cannot_write() -> None:
    """A value of no JSON type is an error naming its type, never a silent str()."""
    odd = ProjectFigures(name="p")
    object.__setattr__(odd, "__dict__", {**odd.__dict__, "extra": object()})
    with pytest.raises(TypeError, match="object"):
        model_json(odd)
