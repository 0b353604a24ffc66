"""Engine state file: atomic, versioned, unreadable files are ignored (the CRs are the fallback)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwm.controller.persistence import load_state, save_state, state_path_for_store


def test_state_path_next_to_the_store() -> None:
    assert state_path_for_store("/var/lib/gpuwm/gpuwm.db") == Path("/var/lib/gpuwm/gpuwm.db.engine.json")
    assert state_path_for_store("http://prometheus:9090").name == "gpuwm-controller.engine.json"


def test_round_trip_and_no_leftovers(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "state.json"
    save_state(path, {"engine": {"a": [1, 2]}, "saved_at": 5.0})
    save_state(path, {"engine": {"a": [3]}, "saved_at": 6.0})
    assert load_state(path) == {"version": 1, "engine": {"a": [3]}, "saved_at": 6.0}
    assert sorted(p.name for p in path.parent.iterdir()) == ["state.json"]


def test_missing_corrupt_or_foreign_state_is_none(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    assert load_state(path) is None
    path.write_text('{"version": 1, "engine": ')  # a torn write from another tool
    assert load_state(path) is None
    path.write_text('{"version": 99}')
    assert load_state(path) is None


def test_state_goes_elsewhere_when_the_store_directory_is_not_writable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUWM_STATE_DIR", str(tmp_path))
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        path = state_path_for_store(str(locked / "sub" / "gpuwm.db"))
        if os.access(locked, os.W_OK):  # running as root: permissions do not stop us
            assert path == locked / "sub" / "gpuwm.db.engine.json"
        else:
            assert path == tmp_path / "gpuwm-controller.engine.json"
    finally:
        locked.chmod(0o700)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert state_path_for_store(str(blocker / "gpuwm.db")) == tmp_path / "gpuwm-controller.engine.json"


def test_streamed_state_is_the_same_document_in_bounded_pieces(tmp_path: Path) -> None:
    from gpuwm.controller.persistence import encode_state, encode_state_chunks

    state = {
        "engine": {"gpus": {f"GPU-{i}": {"history": "A" * 200, "units": i, 3: [1.5, None]} for i in range(2000)},
                   "ids": {7: "seven", 1.5: True}, "empty": {}, "list": [[i, {"k": i}] for i in range(40)]},
        "saved_at": 5.0,
    }
    whole = encode_state(state)
    chunks = list(encode_state_chunks(state))
    assert b"".join(chunks) == whole
    assert max(map(len, chunks)) < len(whole) / 4  # never the whole document in one piece
    path = tmp_path / "state.json"
    save_state(path, state)
    assert path.read_bytes() == whole


def test_a_save_failing_mid_stream_keeps_the_previous_state(tmp_path: Path) -> None:
    from gpuwm.controller.persistence import write_state

    path = tmp_path / "state.json"
    save_state(path, {"engine": {"a": [1]}})

    def broken() -> Iterator[bytes]:
        yield b'{"version":1,"engine":'
        raise RuntimeError("engine changed during the save")

    with pytest.raises(RuntimeError):
        write_state(path, broken())
    assert load_state(path) == {"version": 1, "engine": {"a": [1]}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_an_older_state_file_with_nan_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text('{"version": 1, "engine": {"power": NaN, "peak": Infinity}}')  # as json.dumps wrote it
    loaded = load_state(path)
    assert loaded is not None and loaded["engine"]["peak"] == float("inf")
    assert loaded["engine"]["power"] != loaded["engine"]["power"]  # NaN


def test_a_lazy_engine_state_encodes_to_the_same_bytes_built_a_batch_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """`save(lazy=True)`, what the controller streams: the eager state's bytes, entries built per batch."""
    from gpuwm.accounting import Engine, EngineConfig
    from gpuwm.accounting.persist import LazyEntries
    from gpuwm.controller import persistence
    from gpuwm.controller.persistence import encode_state, encode_state_chunks
    from tests.unit.accounting.helpers import pod, sample

    engine = Engine(EngineConfig(interval_seconds=1.0))
    for index in range(40):  # more entries than a batch, each list: several batches
        devices = [(f"GPU-{index}-{gpu}", 1.0) for gpu in range(2)]
        engine.observe(pod(0.0, f"job-{index}", node=f"n{index % 3}", devices=devices))
    for t in range(1, 6):
        for index in range(40):
            for gpu in range(2):
                engine.observe(sample(float(t), f"GPU-{index}-{gpu}", sm=float((index * t) % 100), energy_joules=10.0 * t))
    engine.observe(pod(5.5, "job-3", phase="Succeeded", devices=[("GPU-3-0", 1.0), ("GPU-3-1", 1.0)]))
    engine.report(6.0)

    eager_engine, lazy_engine = engine.save(), engine.save(lazy=True)
    assert all(isinstance(lazy_engine[name], LazyEntries) for name in ("workloads", "pods", "gpus"))
    assert len(lazy_engine["gpus"]) == 80 and lazy_engine["stretches"] == eager_engine["stretches"]
    eager: dict[str, Any] = {"engine": eager_engine, "saved_at": 6.0}
    lazy: dict[str, Any] = {"engine": lazy_engine, "saved_at": 6.0}

    built: list[int] = []  # how many entries each read of a lazy list built
    real_getitem = LazyEntries.__getitem__

    def counting(self: LazyEntries, index: Any) -> Any:
        value = real_getitem(self, index)
        built.append(len(value) if isinstance(index, slice) else 1)
        return value

    monkeypatch.setattr(LazyEntries, "__getitem__", counting)
    monkeypatch.setattr(persistence, "STREAM_BATCH", 16)
    whole = encode_state(eager)
    assert b"".join(encode_state_chunks(lazy)) == whole
    assert built and max(built) <= 16 and sum(built) == 40 + 40 + 80  # every entry once, 16 at most at a time
    assert encode_state(lazy) == whole  # orjson in one piece reads a lazy list whole
