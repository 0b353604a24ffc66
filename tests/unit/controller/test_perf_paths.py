"""The status cycle's fast paths keep behaviour: cached device holders, orjson state, GC tuning."""

from __future__ import annotations

import gc
import platform
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwm.controller.state.gctuning import GC_THRESHOLDS, collect_cycle_garbage, tune_garbage_collector
from gpuwm.controller.state.persistence import encode_state, load_state, save_state
from gpuwm.feed import sample_columns
from gpuwm.feed.decode import HolderCache, WrongNodeError, parse_snapshot


def _payload(pod: str, node: str = "n1") -> dict[str, object]:
    return {"node": node, "seq": 3, "format": "columns",
            **sample_columns([{"t": 1.0, "node": node, "uuid": "GPU-1", "seq": 3, "sm_percent": 5}]),
            "devices": [{"uuid": "GPU-1", "podUid": f"uid-{pod}", "namespace": "ns", "pod": pod}]}


def test_unchanged_devices_reuse_the_holders_and_changed_ones_are_rebuilt() -> None:
    cache: HolderCache = {}
    first = parse_snapshot(_payload("a"), "n1", cache)
    again = parse_snapshot(_payload("a"), "n1", cache)
    assert again.holders is first.holders
    assert [h.pod_uid for h in again.holders] == ["uid-a"]
    changed = parse_snapshot(_payload("b"), "n1", cache)
    assert changed.holders is not first.holders
    assert [h.pod_uid for h in changed.holders] == ["uid-b"]
    with pytest.raises(WrongNodeError, match="'n1-renamed'"):  # another node's devices are not taken
        parse_snapshot(_payload("b", node="n1-renamed"), "n1", cache)
    uncached = parse_snapshot(_payload("b"), "n1")
    assert uncached.holders == changed.holders and uncached.holders is not changed.holders


def test_state_encoding_reads_back_as_json_with_string_keys(tmp_path: Path) -> None:
    state = {"engine": {"gpus": {"GPU-1": [1.5, None, 0.1 + 0.2]}, "ids": {7: "seven"}}, "saved_at": 12.25}
    encoded = encode_state(state)
    assert isinstance(encoded, bytes)
    path = tmp_path / "state.json"
    save_state(path, state)
    loaded = load_state(path)
    assert loaded is not None
    assert loaded["engine"] == {"gpus": {"GPU-1": [1.5, None, 0.1 + 0.2]}, "ids": {"7": "seven"}}
    assert loaded["saved_at"] == 12.25 and loaded["version"] == 1


@pytest.fixture
def restore_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restore_gc")
def test_garbage_collector_tuning_raises_thresholds_and_freezes_startup_objects() -> None:
    gc.unfreeze()
    tune_garbage_collector()
    assert gc.get_threshold() == GC_THRESHOLDS
    assert gc.get_freeze_count() > 0
    cycle: list[object] = []
    cycle.append(cycle)
    del cycle
    assert gc.collect() >= 1  # cycles are still collected


def test_free_memory_is_released_on_glibc_and_skipped_elsewhere() -> None:
    import ctypes

    from gpuwm.controller.state.gctuning import release_free_memory

    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert release_free_memory() is glibc
    if glibc:
        assert hasattr(ctypes.CDLL(None), "malloc_trim")


@pytest.mark.usefixtures("restore_gc")
def test_a_cycles_garbage_is_collected_at_its_end_even_below_the_young_threshold() -> None:
    gc.unfreeze()
    tune_garbage_collector()
    gc.collect()
    holder: list[object] = []
    witness = weakref.ref(Cyclic(holder))
    del holder
    assert witness() is not None  # in a cycle: reference counting does not free it
    assert gc.get_count()[0] < GC_THRESHOLDS[0]  # far below the threshold: nothing would collect it soon
    assert collect_cycle_garbage() >= 1 and witness() is None


class Cyclic:
    """An object in a reference cycle (a list holding it, it holding the list): freed by the collector only."""

    def __init__(self, holder: list[object]) -> None:
        self.holder = holder
        holder.append(self)
