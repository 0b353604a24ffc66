"""Numbers the controller reads from Kubernetes objects that are NaN or infinite are refused with a log line:
a namespace's GPU quota annotation, a pod's GPU resource quantities."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpuwm.config import DEFAULT_RESOURCE_NAMES, Settings
from gpuwm.controller.kube.client import KubeClient
from gpuwm.controller.runtime import ControllerRuntime
from gpuwm.controller.watch.pods import MalformedPodError, track_pod
from gpuwm.controller.watch.units import requested_units, requests_gpu

from .test_pods_agents import JOB, pod_body

NOT_FINITE = ("NaN", "nan", "inf", "-Infinity", "1e999")


@pytest.mark.parametrize("quantity", [*NOT_FINITE, float("nan"), float("inf")])
def test_a_gpu_quantity_that_is_not_finite_is_refused(quantity: object) -> None:
    spec = pod_body({"nvidia.com/gpu": quantity})["spec"]
    with pytest.raises(ValueError, match="not a finite number"):
        requested_units(spec, DEFAULT_RESOURCE_NAMES)
    with pytest.raises(MalformedPodError, match=r"ns/train-0.*not a finite number"):
        track_pod(pod_body({"nvidia.com/gpu": quantity}), JOB, DEFAULT_RESOURCE_NAMES, deleted=False)
    # still a GPU pod: the handler sees it and names it in its warning (it is not silently ignored)
    assert requests_gpu(spec, DEFAULT_RESOURCE_NAMES)


def _runtime(tmp_path: Path) -> ControllerRuntime:
    settings = Settings(store=str(tmp_path / "gpuwm.db"), agents="static:n1=http://127.0.0.1:9")
    return ControllerRuntime(settings, KubeClient("http://127.0.0.1:9"), clock=lambda: 100.0)


def _namespace(quota: str) -> dict[str, object]:
    return {"metadata": {"name": "ml", "labels": {"gpuwm.io/project": "vision"},
                         "annotations": {"gpuwm.io/gpu-quota": quota, "other": "kept"}}}


@pytest.mark.parametrize("quota", [*NOT_FINITE, "lots"])
def test_a_quota_annotation_that_is_not_a_finite_number_is_not_used_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, quota: str
) -> None:
    runtime = _runtime(tmp_path)
    caplog.set_level(logging.WARNING, logger="gpuwm.controller.runtime")
    runtime.on_namespace(_namespace(quota))
    runtime.on_namespace(_namespace(quota))  # the same again (a resync): one line
    event = runtime.engine.namespaces["ml"]
    assert event.annotations == {"other": "kept"}
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 1 and "namespace ml" in lines[0] and "gpuwm.io/gpu-quota" in lines[0] and repr(quota) in lines[0]


def test_a_finite_quota_annotation_is_used(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    runtime = _runtime(tmp_path)
    runtime.on_namespace(_namespace("4"))
    assert runtime.engine.namespaces["ml"].annotations["gpuwm.io/gpu-quota"] == "4"
    assert not caplog.records
