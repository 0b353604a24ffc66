"""The README's trace format names every field of every trace event, and marks the required ones."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from gpuwm.model import GpuSample
from gpuwm.model.trace import NamespaceEvent, PodEvent, TraceWorkload, WorkloadEvent

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
EVENTS: dict[str, type[BaseModel]] = {"namespace": NamespaceEvent, "pod": PodEvent, "sample": GpuSample,
                                      "workload": WorkloadEvent}
#: fields every line has (written above the table), and the feed's own sequence number (not in traces)
COMMON = {"t", "event", "seq"}


def _row(event: str) -> str:
    found = re.search(rf"^\| `{event}` \| (.*) \|$", README, re.M)
    assert found, f"README's trace table has no row for `{event}`"
    return found.group(1)


def _names(model: type[BaseModel]) -> dict[str, bool]:
    """Each field as a trace line spells it -> whether it is required."""
    return {(field.alias or name): field.is_required() for name, field in model.model_fields.items()}


@pytest.mark.parametrize("event", sorted(EVENTS))
def test_every_field_is_named_and_the_required_ones_in_bold(event: str) -> None:
    row = _row(event)
    for name, required in _names(EVENTS[event]).items():
        if name in COMMON:
            continue
        assert f"`{name}`" in row, f"README's `{event}` row leaves out `{name}`"
        assert (f"**`{name}`**" in row) == required, f"`{event}`.`{name}`: bold exactly when required"


def test_the_pods_workload_fields_are_named() -> None:
    row = _row("pod")
    for name, required in _names(TraceWorkload).items():
        assert (f"**`{name}`**" if required else f"`{name}`") in row, name
