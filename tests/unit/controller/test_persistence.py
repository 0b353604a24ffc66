"""Engine state file: atomic, versioned, unreadable files are ignored (the CRs are the fallback)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwm.controller.state.persistence import load_state, save_state, state_path_for_store


def test_state_path_next_to_the_store() -> None:
    assert state_path_for_store("/var/lib/gpuwm/gpuwm.db") == Path("/var/lib/gpuwm/gpuwm.db.engine.json")
    assert state_path_for_store("http://prometheus:9090").name == "gpuwm-controller.engine.json"


def test_round_trip_and_no_leftovers(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "state.json"
    save_state(path, {"engine": {"a": [1, 2]}, "saved_at": 5.0})
    assert sorted(p.name for p in path.parent.iterdir()) == ["state.json"]
    save_state(path, {"engine": {"a": [3]}, "saved_at": 6.0})
    assert load_state(path) == {"version": 1, "engine": {"a": [3]}, "saved_at": 6.0}
    # the state before last stays beside it, to be written over by the next save
    assert sorted(p.name for p in path.parent.iterdir()) == ["state.json", "state.json.previous"]
    assert load_state(path.with_name("state.json.previous")) == {"version": 1, "engine": {"a": [1, 2]}, "saved_at": 5.0}


def test_each_save_is_written_over_the_state_before_last_in_place(tmp_path: Path) -> None:
    """No new file per save: the file before last is overwritten (its pages are cached), then takes the
    state's name; the old state becomes the file before last. A shorter state leaves nothing of a longer one."""
    from gpuwm.controller.state.persistence import previous_path

    path = tmp_path / "state.json"
    save_state(path, {"engine": {"a": list(range(500))}, "saved_at": 1.0})
    save_state(path, {"engine": {"a": list(range(400))}, "saved_at": 2.0})
    for saved_at in (3.0, 4.0, 5.0):
        state_inode, previous_inode = path.stat().st_ino, previous_path(path).stat().st_ino
        save_state(path, {"engine": {"a": [int(saved_at)]}, "saved_at": saved_at})
        assert path.stat().st_ino == previous_inode  # written in place, then renamed
        assert previous_path(path).stat().st_ino == state_inode
        assert path.read_bytes() == b'{"version":1,"engine":{"a":[%d]},"saved_at":%r}' % (int(saved_at), saved_at)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json", "state.json.previous"]


def test_leftovers_of_a_killed_save_do_no_harm(tmp_path: Path) -> None:
    """Killed between the link and the renames: a `.swap` name is left, or the file before last is the
    state itself under a second name. The next save neither fails nor writes over the state it reads."""
    from gpuwm.controller.state.persistence import previous_path

    path = tmp_path / "state.json"
    save_state(path, {"engine": {"a": [1]}})
    os.link(path, tmp_path / "state.json.swap")
    save_state(path, {"engine": {"a": [2]}})
    assert load_state(path) == {"version": 1, "engine": {"a": [2]}}
    previous_path(path).unlink()
    os.link(path, previous_path(path))  # one file, two names
    save_state(path, {"engine": {"a": [3]}})
    assert load_state(path) == {"version": 1, "engine": {"a": [3]}}
    assert load_state(previous_path(path)) == {"version": 1, "engine": {"a": [2]}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json", "state.json.previous"]


def test_without_hard_links_the_state_is_simply_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_links(source: Any, target: Any) -> None:
        raise PermissionError("hard links are not allowed here")

    monkeypatch.setattr(os, "link", no_links)
    path = tmp_path / "state.json"
    for value in (1, 2, 3):
        save_state(path, {"engine": {"a": [value]}})
    assert load_state(path) == {"version": 1, "engine": {"a": [3]}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


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
    from gpuwm.controller.state.persistence import encode_state, encode_state_chunks

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
    from gpuwm.controller.state.persistence import write_state

    path = tmp_path / "state.json"
    save_state(path, {"engine": {"a": [1]}})

    def broken() -> Iterator[bytes]:
        yield b'{"version":1,"engine":'
        raise RuntimeError("engine changed during the save")

    with pytest.raises(RuntimeError):
        write_state(path, broken())
    assert load_state(path) == {"version": 1, "engine": {"a": [1]}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
    save_state(path, {"engine": {"a": [2]}})
    with pytest.raises(RuntimeError):  # the state before last was half written over: it goes, the state stays
        write_state(path, broken())
    assert load_state(path) == {"version": 1, "engine": {"a": [2]}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_an_older_state_file_with_nan_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text('{"version": 1, "engine": {"power": NaN, "peak": Infinity}}')  # as json.dumps wrote it
    loaded = load_state(path)
    assert loaded is not None and loaded["engine"]["peak"] == float("inf")
    assert loaded["engine"]["power"] != loaded["engine"]["power"]  # NaN


def test_a_lazy_engine_state_is_written_in_sections_built_a_batch_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`save(lazy=True)`, what the controller streams: each big list a section of JSON lines after the JSON,
    its entries built a batch at a time; read back, the eager state's document."""
    import orjson

    from gpuwm.accounting.persist import LazyEntries
    from gpuwm.controller.state import persistence
    from gpuwm.controller.state.persistence import (
        LINES_KEY,
        SECTIONS_MAGIC,
        SavedLines,
        encode_state,
        encode_state_chunks,
    )

    engine = _busy_engine(workloads=40, seconds=5)  # more entries than a batch, each list: several batches

    eager_engine, lazy_engine = engine.save(), engine.save(lazy=True)
    sectioned = ("workloads", "pods", "gpus", "stretches")
    assert all(isinstance(lazy_engine[name], LazyEntries) for name in sectioned)
    assert len(lazy_engine["gpus"]) == 80 and list(lazy_engine["stretches"]) == eager_engine["stretches"]
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
    chunks = list(encode_state_chunks(lazy))
    assert built and max(built) <= 16 and sum(built) == 40 + 40 + 80 + 80  # every entry once, 16 at most at a time
    data = b"".join(chunks)
    assert data.endswith(SECTIONS_MAGIC) and data.count(f'{{"{LINES_KEY}":'.encode()) == 4
    assert max(map(len, chunks)) < len(whole) / 4  # never the whole document in one piece
    path = tmp_path / "state.json"
    path.write_bytes(data)
    loaded = load_state(path)
    assert loaded is not None
    assert all(isinstance(loaded["engine"][name], SavedLines) for name in sectioned)
    assert [len(loaded["engine"][name]) for name in sectioned] == [40, 40, 80, 80]
    assert list(loaded["engine"]["gpus"])[79] == orjson.loads(whole)["engine"]["gpus"][79]
    loaded["engine"] = {key: list(value) if isinstance(value, SavedLines) else value
                        for key, value in loaded["engine"].items()}
    assert loaded == orjson.loads(whole)
    assert encode_state(lazy) == whole  # orjson in one piece reads a lazy list whole


def test_a_sectioned_state_restores_the_same_engine_and_controller(tmp_path: Path) -> None:
    """The controller's restore reads each section once (consumed): the same engine, its strings one copy each."""
    import orjson

    from gpuwm.accounting import Engine, EngineConfig
    from gpuwm.controller.state.persistence import SavedLines, encode_state_chunks, write_state

    engine = _busy_engine(workloads=20, seconds=5)
    path = tmp_path / "state.json"
    write_state(path, encode_state_chunks({"engine": engine.save(lazy=True, raw=True)}))
    loaded = load_state(path)
    assert loaded is not None
    sections = [loaded["engine"][name] for name in ("workloads", "pods", "gpus", "stretches")]
    restored = Engine.restore(loaded["engine"], EngineConfig(interval_seconds=1.0), consume=True)
    assert orjson.dumps(restored.save(), option=orjson.OPT_NON_STR_KEYS) == orjson.dumps(
        engine.save(), option=orjson.OPT_NON_STR_KEYS)
    assert restored.report(45.0) == engine.report(45.0)
    assert all(isinstance(section, SavedLines) for section in sections)
    with pytest.raises(ValueError, match="consumed section"):
        list(sections[0])  # read once: its bytes are gone
    first, fourth = restored.gpu_records["GPU-0-0"], restored.gpu_records["GPU-3-0"]
    assert first.node == fourth.node and first.node is fourth.node  # interned: one string, not one per entry
    assert first.stretches[0].uuid is first.uuid
    assert first.latest is not None and fourth.latest is not None


def _busy_engine(merged: bool = False, workloads: int = 30, seconds: int = 39) -> Any:
    """`workloads` jobs of 2 GPUs sampled each second for `seconds`, job-3 ended half a second before the
    last, a report a second after it: windows and GPU histories (with merged polls and a GPU whose size
    changed, on request)."""
    from gpuwm.accounting import Engine, EngineConfig
    from tests.unit.accounting.helpers import pod, sample

    engine = Engine(EngineConfig(interval_seconds=1.0))
    for index in range(workloads):
        devices = [(f"GPU-{index}-{gpu}", 1.0) for gpu in range(2)]
        engine.observe(pod(0.0, f"job-{index}", node=f"n{index % 3}", devices=devices))
    for t in range(1, seconds + 1):
        for index in range(workloads):
            for gpu in range(2):
                extra: dict[str, Any] = {}
                if merged and t % 5 == 0:
                    extra["merged_seconds"] = 1.0
                if merged and index == 2 and gpu == 0 and t > 20:
                    extra["device_units"] = 0.5
                engine.observe(sample(float(t), f"GPU-{index}-{gpu}", sm=float((index * t) % 100),
                                      energy_joules=10.0 * t, **extra))
    engine.observe(pod(seconds + 0.5, "job-3", phase="Succeeded", devices=[("GPU-3-0", 1.0), ("GPU-3-1", 1.0)]))
    engine.report(seconds + 1.0)
    return engine


def _with_document(data: bytes, document: bytes) -> bytes:
    """A sectioned state file's bytes with its JSON replaced by `document`, the offsets after it moved along."""
    import struct

    from gpuwm.controller.state.persistence import SECTIONS_MAGIC

    sections, columns, table = struct.unpack_from("<QQQ", data, len(data) - 32)
    shift = len(document) + 1 - sections
    return (document + data[sections - 1:-32]
            + struct.pack("<QQQ8s", sections + shift, columns + shift, table + shift, SECTIONS_MAGIC))


@pytest.mark.parametrize("merged", [False, True])
def test_raw_columns_go_after_the_json_and_restore_the_same_engine(tmp_path: Path, merged: bool) -> None:
    """`save(raw=True)`, what the controller writes: window segments and GPU histories as bytes after the
    JSON, named in it by offset; read back, the engine is the one saved (its base64 state, its report)."""
    import orjson

    from gpuwm.accounting import Engine, EngineConfig
    from gpuwm.controller.state.persistence import (
        RAW_KEY,
        SECTIONS_MAGIC,
        encode_state,
        encode_state_chunks,
        write_state,
    )

    engine = _busy_engine(merged)
    path = tmp_path / "state.json"
    write_state(path, encode_state_chunks({"engine": engine.save(lazy=True, raw=True), "saved_at": 40.0}))
    data = path.read_bytes()
    base64_size = len(encode_state({"engine": engine.save(), "saved_at": 40.0}))
    assert data.endswith(SECTIONS_MAGIC) and len(data) < base64_size
    assert RAW_KEY.encode() in data and b'"floats"' in data
    if merged:  # the merged polls and the changed device size came along
        assert b'"floatColumns":5' in data
    loaded = load_state(path)
    assert loaded is not None and loaded["saved_at"] == 40.0
    restored = Engine.restore(loaded["engine"], EngineConfig(interval_seconds=1.0), consume=True)
    assert orjson.dumps(restored.save(), option=orjson.OPT_NON_STR_KEYS) == orjson.dumps(
        engine.save(), option=orjson.OPT_NON_STR_KEYS)
    assert restored.report(45.0) == engine.report(45.0)
    if merged:
        gpu = restored.gpu_records["GPU-2-0"]
        assert 0.5 in list(gpu.device_units) and any(value != 0.0 for value in gpu.merged)


def test_a_state_without_raw_columns_is_plain_json(tmp_path: Path) -> None:
    """Nothing raw to carry (a small state, the tests' states): the file is JSON alone, as before."""
    from gpuwm.controller.state.persistence import SECTIONS_MAGIC, encode_state, encode_state_chunks

    state = {"engine": _busy_engine().save(), "saved_at": 40.0}
    assert b"".join(encode_state_chunks(state)) == encode_state(state)
    assert not encode_state(state).endswith(SECTIONS_MAGIC)


def test_raw_columns_in_one_piece_are_base64(tmp_path: Path) -> None:
    """`encode_state` has nowhere to put raw bytes: they go into the JSON as base64, which restores too."""
    from gpuwm.accounting import Engine, EngineConfig
    from gpuwm.controller.state.persistence import encode_state

    engine = _busy_engine(merged=True)
    path = tmp_path / "state.json"
    path.write_bytes(encode_state({"engine": engine.save(raw=True)}))
    loaded = load_state(path)
    assert loaded is not None
    restored = Engine.restore(loaded["engine"], EngineConfig(interval_seconds=1.0))
    assert restored.report(45.0) == engine.report(45.0)


@pytest.mark.parametrize("damage", ["reference past the raw bytes", "bad reference", "columns of unequal length"])
def test_a_damaged_raw_reference_is_none_not_a_crash(tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    """A raw column reference that does not add up is ignored with a warning (the CRs are the fallback)."""
    import struct

    from gpuwm.accounting import Engine, EngineConfig
    from gpuwm.accounting.persist import StateError
    from gpuwm.controller.state.persistence import encode_state_chunks, write_state

    path = tmp_path / "state.json"
    write_state(path, encode_state_chunks({"engine": _busy_engine().save(raw=True)}))
    data = path.read_bytes()
    document = data[:struct.unpack_from("<Q", data, len(data) - 32)[0] - 1]
    if damage == "reference past the raw bytes":
        document = document.replace(b'{"$raw":[0,', b'{"$raw":[99999999,', 1)
    elif damage == "bad reference":
        document = document.replace(b'{"$raw":[0,', b'{"$raw":[-1,', 1)
    else:  # a GPU history whose bytes are not four equal columns: read, but not restorable
        first = document.index(b'"floats":{"$raw":[') + len(b'"floats":{"$raw":[')
        offset, length = document[first:document.index(b"]", first)].split(b",")
        document = document.replace(b'"floats":{"$raw":[' + offset + b"," + length + b"]",
                                    b'"floats":{"$raw":[' + offset + b"," + str(int(length) - 8).encode() + b"]", 1)
    assert document != data[:len(document)]
    path.write_bytes(_with_document(data, document))
    loaded = load_state(path)
    if damage == "columns of unequal length":
        assert loaded is not None
        with pytest.raises(StateError, match="not 4 equal columns"):
            Engine.restore(loaded["engine"], EngineConfig(interval_seconds=1.0))
    else:
        assert loaded is None
        assert "rebuilding from CR status" in caplog.text


@pytest.mark.parametrize("damage", ["offsets out of order", "table not rows", "section past the columns",
                                    "cut trailer", "fewer lines", "reference past the raw bytes", "line not JSON",
                                    "file shortened after loading"])
def test_a_damaged_sectioned_state_file_is_none_or_unusable_not_a_crash(
        tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    """A sectioned state file that does not add up: None with a warning when its frame is wrong; a StateError
    from the restore when an entry is (sections are read then), which the controller takes as no state."""
    import struct

    from gpuwm.accounting import Engine, EngineConfig
    from gpuwm.accounting.persist import StateError
    from gpuwm.controller.state.persistence import SECTIONS_MAGIC, encode_state_chunks, write_state

    path = tmp_path / "state.json"
    write_state(path, encode_state_chunks({"engine": _busy_engine().save(lazy=True, raw=True)}))
    data = path.read_bytes()
    sections, columns, table = struct.unpack_from("<QQQ", data, len(data) - 32)
    trailer = data[-32:]
    if damage == "offsets out of order":
        data = data[:-32] + struct.pack("<QQQ8s", columns + 1, columns, table, SECTIONS_MAGIC)
    elif damage == "table not rows":
        data = data[:table] + b'{"rows":1}' + struct.pack("<QQQ8s", sections, columns, table, SECTIONS_MAGIC)
    elif damage == "section past the columns":
        data = data[:table] + b"[[0,999999999,1]]" + struct.pack("<QQQ8s", sections, columns, table, SECTIONS_MAGIC)
    elif damage == "cut trailer":
        data = data[:-40] + trailer[-24:]
    elif damage == "fewer lines":  # the first section's first line break gone: one entry less than the table says
        newline = data.index(b"\n", sections)
        data = data[:newline] + b" " + data[newline + 1:]
    elif damage == "reference past the raw bytes":  # the columns said to begin 8 bytes before the table
        data = data[:-32] + struct.pack("<QQQ8s", sections, table - 8, table, SECTIONS_MAGIC)
    elif damage == "line not JSON":
        data = data[:sections] + b"{" + data[sections + 1:].replace(b"{", b"[", 1)
    path.write_bytes(data)
    loaded = load_state(path)
    if damage in ("offsets out of order", "table not rows", "section past the columns", "cut trailer"):
        assert loaded is None
        assert "rebuilding from CR status" in caplog.text
        return
    assert loaded is not None
    if damage == "file shortened after loading":
        with path.open("r+b") as file:
            file.truncate(sections + 10)
    with pytest.raises(StateError):
        Engine.restore(loaded["engine"], EngineConfig(interval_seconds=1.0), consume=True)


def test_raw_doubles_and_their_reading() -> None:
    from array import array

    from gpuwm.accounting.rawcolumns import RawDoubles, doubles_from_saved

    column = array("d", [1.5, float("nan"), -2.0])
    raw = RawDoubles(column)
    assert raw.nbytes == 24 and raw.data is column  # the column itself, not a copy
    assert list(doubles_from_saved(raw.base64()))[::2] == [1.5, -2.0]
    assert list(doubles_from_saved(memoryview(column.tobytes())))[::2] == [1.5, -2.0]
    assert RawDoubles(column.tobytes() + column.tobytes()).nbytes == 48
    with pytest.raises(ValueError):
        doubles_from_saved(b"\x00" * 7)  # not whole doubles
    with pytest.raises(ValueError, match="base64 text or bytes"):
        doubles_from_saved(3)  # type: ignore[arg-type]


def test_a_raw_state_holds_the_same_samples_and_pod_events_as_dumped_models(tmp_path: Path) -> None:
    """Raw: each device's latest sample and each pod event go as pydantic-core's JSON of the model (`RawJson`);
    read back, they are what `model_dump(mode="json")` gave, and the state file restores the same engine."""
    import orjson

    from gpuwm.accounting import Engine, EngineConfig
    from gpuwm.accounting.rawcolumns import RawJson
    from gpuwm.controller.state.persistence import encode_state, encode_state_chunks, write_state
    from tests.unit.accounting.helpers import sample

    engine = _busy_engine(workloads=4, seconds=5)
    engine.observe(sample(6.0, "GPU-0-0", sm=None, healthy=False, error="GPU is lost", energy_joules=None))
    raw, dumped = engine.save(raw=True), engine.save()
    assert isinstance(raw["gpus"][0]["latest"], RawJson) and isinstance(raw["pods"][0]["timeline"][0][1], RawJson)
    from_raw = orjson.loads(encode_state({"engine": raw}))["engine"]
    assert [gpu["latest"] for gpu in from_raw["gpus"]] == [gpu["latest"] for gpu in dumped["gpus"]]
    assert [pod["timeline"] for pod in from_raw["pods"]] == [pod["timeline"] for pod in dumped["pods"]]
    assert any(gpu["latest"]["error"] == "GPU is lost" for gpu in from_raw["gpus"])
    path = tmp_path / "state.json"
    write_state(path, encode_state_chunks({"engine": engine.save(lazy=True, raw=True)}))
    loaded = load_state(path)
    assert loaded is not None
    restored = Engine.restore(loaded["engine"], EngineConfig(interval_seconds=1.0))
    assert orjson.dumps(restored.save(), option=orjson.OPT_NON_STR_KEYS) == orjson.dumps(
        dumped, option=orjson.OPT_NON_STR_KEYS)
