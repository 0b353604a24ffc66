"""GPU units from resource names: whole GPUs, MIG profiles, time-sliced replicas."""

from __future__ import annotations

import pytest

from gpuwm.config import DEFAULT_RESOURCE_NAMES
from gpuwm.controller.watch.units import (
    matches_resource,
    mig_fraction,
    mig_profile,
    node_replicas_label,
    requested_units,
    requests_gpu,
    units_per_request,
)


@pytest.mark.parametrize(
    ("profile", "fraction"),
    [("1g.10gb", 1 / 7), ("2g.20gb", 2 / 7), ("3g.40gb", 3 / 7), ("4g.40gb", 4 / 7), ("7g.80gb", 1.0),
     ("1g.5gb", 1 / 7), ("1g.20gb", 1 / 7), ("1g.6gb", 1 / 4), ("2g.12gb", 2 / 4), ("4g.24gb", 1.0),
     ("1c.3g.40gb", 1 / 7)],
)
def test_mig_fraction(profile: str, fraction: float) -> None:
    assert mig_fraction(profile) == pytest.approx(fraction)


def test_mig_fraction_names_a_bad_profile() -> None:
    with pytest.raises(ValueError, match="'big'"):
        mig_fraction("big")


def test_mig_profile_from_resource_name() -> None:
    assert mig_profile("nvidia.com/mig-1g.10gb") == "1g.10gb"
    assert mig_profile("nvidia.com/mig-3g.40gb.shared") == "3g.40gb"
    assert mig_profile("nvidia.com/gpu") is None


def test_units_per_request() -> None:
    assert units_per_request("nvidia.com/gpu", 1) == 1.0
    assert units_per_request("nvidia.com/gpu", 4) == 0.25  # a time-sliced node
    assert units_per_request("nvidia.com/gpu.shared", 2) == 0.5
    assert units_per_request("nvidia.com/mig-2g.20gb", 1) == pytest.approx(2 / 7)


def test_matches_globs() -> None:
    assert matches_resource("nvidia.com/mig-1g.10gb", DEFAULT_RESOURCE_NAMES)
    assert not matches_resource("amd.com/gpu", DEFAULT_RESOURCE_NAMES)
    assert not matches_resource("cpu", DEFAULT_RESOURCE_NAMES)


def _spec(*containers: dict[str, object], init: list[dict[str, object]] | None = None) -> dict[str, object]:
    return {"containers": list(containers), "initContainers": init or []}


def test_requested_units_per_container() -> None:
    spec = _spec(
        {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "4"}}},
        {"name": "b", "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}},
        {"name": "c", "resources": {"limits": {"nvidia.com/gpu.shared": "1"}}},
        {"name": "d", "resources": {"requests": {"cpu": "1"}}},
    )
    units = requested_units(spec, DEFAULT_RESOURCE_NAMES, shared_replicas=4)
    assert units == pytest.approx({"a": 2.0, "b": 1 / 7, "c": 0.25})


def test_requested_units_time_sliced_node_and_sidecars() -> None:
    spec = _spec({"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                 init=[{"name": "once", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                       {"name": "sidecar", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": "1"}}}])
    # a one-shot init container does not hold its GPU for the pod's life; a sidecar does
    assert requested_units(spec, DEFAULT_RESOURCE_NAMES, replicas=2) == {"a": 0.5, "sidecar": 0.5}


def test_requests_gpu_filter() -> None:
    assert requests_gpu(_spec({"name": "a", "resources": {"limits": {"nvidia.com/gpu": 1}}}), DEFAULT_RESOURCE_NAMES)
    assert not requests_gpu(_spec({"name": "a", "resources": {"limits": {"nvidia.com/gpu": 0}}}), DEFAULT_RESOURCE_NAMES)
    assert not requests_gpu(_spec({"name": "a"}), DEFAULT_RESOURCE_NAMES)
    assert not requests_gpu(None, DEFAULT_RESOURCE_NAMES)
    # malformed but GPU-requesting: let it through so the handler can name it in a warning
    assert requests_gpu(_spec({"name": "a", "resources": {"limits": {"nvidia.com/gpu": "x"}}}), DEFAULT_RESOURCE_NAMES)


def test_node_replicas_label() -> None:
    assert node_replicas_label({"nvidia.com/gpu.replicas": "4"}) == 4
    assert node_replicas_label({"nvidia.com/gpu.replicas": "1"}) == 1  # GFD's "not shared"
    assert node_replicas_label({"nvidia.com/gpu.replicas": "junk"}) is None  # unreadable: the next source says
    assert node_replicas_label({"nvidia.com/gpu.replicas": "0"}) is None
    assert node_replicas_label(None) is None
