"""Where the engine's state survives a restart (DESIGN §2: restarts lose nothing).

The state file sits next to the embedded store (`<store>.engine.json`), or under
`$GPUWM_STATE_DIR`/the working directory when the store is a Prometheus URL. It is
written atomically (another file, fsync, rename), so a controller killed with SIGKILL leaves
either the previous state or the new one, never half of one. The other file is the state
before last (`<store>.engine.json.previous`), overwritten in place by each save.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from gpuwm.accounting import LazyEntries, RawDoubles, RawJson

logger = logging.getLogger(__name__)

STATE_VERSION = 1


def _writable_directory(directory: Path) -> bool:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(directory, os.W_OK)


def state_path_for_store(store: str) -> Path:
    """The engine-state file for a `--store` value.

    Next to an embedded store; for a Prometheus store, or a store directory this process cannot
    write, under $GPUWM_STATE_DIR or the temp directory (survives a process restart, not a new pod:
    then the CRs' status is the fallback).
    """
    if not store.startswith(("http://", "https://")):
        path = Path(store).with_name(Path(store).name + ".engine.json")
        if _writable_directory(path.parent):
            return path
        logger.warning("cannot write next to --store %s; keeping the engine state elsewhere", store)
    directory = Path(os.environ.get("GPUWM_STATE_DIR") or tempfile.gettempdir())
    return directory / "gpuwm-controller.engine.json"


#: containers with more children than this are encoded in batches of STREAM_BATCH children: larger batches
#: raise the controller's RSS during a save at the same CPU
STREAM_SPLIT = 16
STREAM_BATCH = 64
#: how deep the streaming encoder looks for big containers; below that a value is one orjson call
STREAM_DEPTH = 4
_OPTIONS = orjson.OPT_NON_STR_KEYS


#: how the JSON names a raw column: {"$raw": [offset from the raw bytes' start, length in bytes]}
RAW_KEY = "$raw"

#: the last bytes of a state file whose big lists (`LazyEntries`) are sections of JSON lines after
#: the JSON, before the raw columns; then, before them, where the sections, the raw columns and the
#: sections' table begin (3 x uint64, little-endian). The table is JSON: [[offset from the sections'
#: start, length in bytes, entries], ...]
SECTIONS_MAGIC = b"GPUWMLN2"
_SECTIONS_TRAILER = struct.Struct("<QQQ8s")
#: how the JSON names a section: {"$lines": its index in the table}
LINES_KEY = "$lines"


def encode_state(state: dict[str, Any]) -> bytes:
    """The state as JSON bytes, in one piece (small states and tests; saving streams instead), raw
    columns (`RawDoubles`) as base64 text. Non-string keys become strings as `json.dumps` makes them."""
    return orjson.dumps({"version": STATE_VERSION, **state}, default=_entries, option=_OPTIONS)


def _entries(value: Any) -> Any:
    """orjson's fallback: a lazily built list of the engine's state (`save_state(lazy=True)`) as a list,
    a raw column as base64 text."""
    if isinstance(value, LazyEntries):
        return list(value)
    if isinstance(value, RawDoubles):
        return value.base64()
    if isinstance(value, RawJson):
        return orjson.Fragment(value.data)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


class _RawSection:
    """The raw columns met while encoding the JSON, in order: written after it, named in it by offset."""

    def __init__(self) -> None:
        self.columns: list[RawDoubles] = []
        self.size = 0

    def default(self, value: Any) -> Any:
        if isinstance(value, RawDoubles):
            reference = {RAW_KEY: [self.size, value.nbytes]}
            self.columns.append(value)
            self.size += value.nbytes
            return reference
        return _entries(value)


def _chunks(value: Any, depth: int, default: Callable[[Any], Any]) -> Iterator[bytes]:
    """`value` as JSON in pieces of at most a batch of children, never the whole document at once; a lazy
    list is what `default` makes of it (a section, see `encode_state_chunks`), not spelt out."""
    if isinstance(value, LazyEntries):
        yield orjson.dumps(default(value), option=_OPTIONS)
        return
    if depth <= 0 or not isinstance(value, dict | list) or not value:
        yield orjson.dumps(value, default=default, option=_OPTIONS)
        return
    if isinstance(value, dict):
        yield b"{"
        items = list(value.items())
        if len(items) > STREAM_SPLIT:
            for start in range(0, len(items), STREAM_BATCH):
                # `{"k":v,...}` without its braces: orjson writes the keys exactly as for the whole dict
                yield (b"," if start else b"") + orjson.dumps(
                    dict(items[start:start + STREAM_BATCH]), default=default, option=_OPTIONS)[1:-1]
        else:
            for index, (key, child) in enumerate(items):
                yield (b"," if index else b"") + orjson.dumps({key: None}, option=_OPTIONS)[1:-5]  # `"key":`
                yield from _chunks(child, depth - 1, default)
        yield b"}"
        return
    yield b"["
    if len(value) > STREAM_SPLIT:
        for start in range(0, len(value), STREAM_BATCH):
            yield (b"," if start else b"") + orjson.dumps(
                value[start:start + STREAM_BATCH], default=default, option=_OPTIONS)[1:-1]
    else:
        for index, child in enumerate(value):
            if index:
                yield b","
            yield from _chunks(child, depth - 1, default)
    yield b"]"


def encode_state_chunks(state: dict[str, Any]) -> Iterator[bytes | memoryview]:
    """The state streamed in pieces: a large state never sits in memory, encoded, in one piece.

    Without lazy lists (`LazyEntries`) nor raw columns the pieces are exactly `encode_state`'s JSON.
    Otherwise, after the JSON and a newline (see `SECTIONS_MAGIC`):
    - each lazy list is a section of JSON lines, one entry a line, which the JSON names by
      `{"$lines": index}`: `load_state` reads it an entry at a time (`SavedLines`);
    - raw columns (`RawDoubles`, from `Engine.save(raw=True)`) are bytes named by offset and length
      (`{"$raw": [offset, length]}`) from the columns' start, written from the engine's own arrays;
    - the sections' table and the trailer.
    Like a lazy state, this must be consumed before the engine changes again.
    """
    raw = _RawSection()
    sections: list[LazyEntries] = []

    def section(value: Any) -> Any:
        if isinstance(value, LazyEntries):
            sections.append(value)
            return {LINES_KEY: len(sections) - 1}
        return raw.default(value)

    written = 0
    for chunk in _chunks({"version": STATE_VERSION, **state}, STREAM_DEPTH, section):
        written += len(chunk)
        yield chunk
    if not raw.columns and not sections:
        return
    yield b"\n"
    sections_start = written + 1
    table: list[list[int]] = []
    offset = 0
    for entries in sections:
        length = 0
        for start in range(0, len(entries), STREAM_BATCH):
            # one entry a line: orjson writes no newline inside a value, so lines split exactly
            lines = b"".join(orjson.dumps(entry, default=raw.default, option=_OPTIONS) + b"\n"
                             for entry in entries[start:start + STREAM_BATCH])
            length += len(lines)
            yield lines
        table.append([offset, length, len(entries)])
        offset += length
    columns_start = sections_start + offset
    for column in raw.columns:
        yield memoryview(column.data).cast("B")  # a view of the column: its bytes, not a copy
    table_start = columns_start + raw.size
    yield orjson.dumps(table)
    yield _SECTIONS_TRAILER.pack(sections_start, columns_start, table_start, SECTIONS_MAGIC)


def write_state(path: Path, payload: bytes | Iterable[bytes | memoryview]) -> None:
    commit_state(stage_state(path, payload), path)


def previous_path(path: Path) -> Path:
    """The state file before last (`<state>.previous`): the next save is written over it, in place."""
    return path.with_name(path.name + ".previous")


def stage_state(path: Path, payload: bytes | Iterable[bytes | memoryview]) -> Path:
    """Write the state over the state file before last (`previous_path`), not yet synced nor in place
    (`commit_state`, the slow part, can run in a thread once the engine-referencing chunks are written).

    Overwritten in place, not a new temp file: its pages are in the page cache already, where a new
    file takes a state's worth of fresh pages each save, which costs kernel CPU. It is never the file
    `load_state` reads, so a save cut short leaves the state as it was.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    spare = previous_path(path)
    with contextlib.suppress(FileNotFoundError):
        if spare.samefile(path):  # one file under both names (a copy made with links): never write the state itself
            spare.unlink()
    descriptor = os.open(spare, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        with os.fdopen(descriptor, "wb", buffering=1 << 20) as file:
            written = 0
            for chunk in (payload,) if isinstance(payload, bytes) else payload:
                file.write(chunk)
                written += len(chunk)
            file.flush()
            os.ftruncate(file.fileno(), written)  # what is left of the older, longer state
    except BaseException:
        spare.unlink(missing_ok=True)  # half overwritten: of no use as the state before last
        raise
    return spare


def commit_state(staged: Path, path: Path) -> None:
    """fsync a staged state file and rename it over `path` (atomic: the old state or the new, never half);
    the old state stays as the state before last (`previous_path`) through a hard link, where possible."""
    try:
        _fsync(staged)
        swap = path.with_name(path.name + ".swap")
        swap.unlink(missing_ok=True)  # left by a controller killed in the middle of this
        try:
            os.link(path, swap)
            kept = True
        except OSError:
            kept = False  # no state yet, or links not possible here
        os.replace(staged, path)
        if kept:
            os.replace(swap, previous_path(path))
        # a rename is in the folder's entries: until they reach the disk a power cut can bring back the old name
        _fsync(path.parent, getattr(os, "O_DIRECTORY", 0))
    except BaseException:
        staged.unlink(missing_ok=True)
        raise


def _fsync(path: Path, flags: int = 0) -> None:
    descriptor = os.open(path, os.O_RDONLY | flags)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def save_state(path: Path, state: dict[str, Any]) -> None:
    write_state(path, encode_state_chunks(state))


def load_state(path: Path) -> dict[str, Any] | None:
    """The saved state, or None when there is none or it cannot be read (logged, never fatal).

    Raw columns come back as bytes where the JSON names them, which the engine's restore reads as
    it reads base64 text. A sectioned file's big lists come back as `SavedLines`, read from the
    file an entry at a time, which must be read before the state file is saved over twice (the
    controller restores right after loading). A file of JSON alone is read whole.
    """
    try:
        with path.open("rb") as file:
            size = file.seek(0, os.SEEK_END)
            if size >= _SECTIONS_TRAILER.size:
                file.seek(size - _SECTIONS_TRAILER.size)
                trailer = file.read(_SECTIONS_TRAILER.size)
                if trailer.endswith(SECTIONS_MAGIC):
                    return _load_sections(path, file, size, trailer)
            file.seek(0)
            data = file.read()
    except FileNotFoundError:
        return None
    except OSError as error:
        logger.warning("cannot read engine state %s (%s); rebuilding from CR status", path, error)
        return None
    try:
        state = json.loads(data)  # json, not orjson: orjson.loads peaks far higher in memory on a large state
    except ValueError as error:
        logger.warning("engine state %s is not valid JSON (%s); rebuilding from CR status", path, error)
        return None
    return _checked(path, state)


def _checked(path: Path, state: Any) -> dict[str, Any] | None:
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        logger.warning("engine state %s has an unknown format; rebuilding from CR status", path)
        return None
    return state


class _StateFile:
    """A sectioned state file kept open while its sections and columns are read (closed with the last of them)."""

    __slots__ = ("columns_end", "columns_start", "descriptor")

    def __init__(self, descriptor: int, columns_start: int, columns_end: int) -> None:
        self.descriptor = descriptor
        self.columns_start = columns_start
        self.columns_end = columns_end

    def read(self, offset: int, length: int) -> bytes:
        data = os.pread(self.descriptor, length, offset)
        if len(data) != length:
            raise ValueError(f"the state file ends before byte {offset + length}: was it written over?")
        return data

    def column(self, reference: Any) -> bytes:
        """The bytes a `{"$raw": [offset, length]}` names (read from the file: not all columns in memory)."""
        offset, length = _raw_range(reference, self.columns_end - self.columns_start)
        return self.read(self.columns_start + offset, length)

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.descriptor)


class SavedLines:
    """A section of a state file: its entries, each parsed when read (see `encode_state_chunks`).

    A whole parsed document holds all its small objects until the end, and the engine's objects spread
    among them keep the memory they leave from going back. Read an entry at a time (`consume()`: once,
    the bytes let go after the last), an entry's objects reuse the last one's memory. Strings are
    interned: a node, namespace or UUID repeated in many entries is kept once, as the live controller does.
    """

    __slots__ = ("_count", "_data", "_file", "_length", "_offset")

    def __init__(self, file: _StateFile, offset: int, length: int, count: int) -> None:
        self._file: _StateFile | None = file
        self._offset = offset
        self._length = length
        self._count = count
        self._data: bytes | None = None

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Any]:
        if self._data is None:
            if self._file is None:
                raise ValueError("a consumed section of the state file is read again")
            self._data = self._file.read(self._offset, self._length)
            if self._data.count(b"\n") != self._count or (self._data and not self._data.endswith(b"\n")):
                raise ValueError(f"a section of the state file holds not {self._count} lines")
        data, file = self._data, self._file
        assert file is not None
        start = 0
        for _ in range(self._count):
            end = data.index(b"\n", start)
            yield _resolved(json.loads(data[start:end]), file)
            start = end + 1

    def consume(self) -> Iterator[Any]:
        """Each entry once, in order; the section is of no more use afterwards (its bytes and file let go)."""
        try:
            yield from self
        finally:
            self._data = None
            self._file = None


def _resolved(entry: Any, file: _StateFile) -> Any:
    """`entry` with its raw columns read and its strings interned (see `SavedLines`)."""
    if type(entry) is str:
        return sys.intern(entry)
    _replace_references(entry, {RAW_KEY: file.column}, sys.intern)
    return entry


def _load_sections(path: Path, file: BinaryIO, size: int, trailer: bytes) -> dict[str, Any] | None:
    """A sectioned state file (`trailer`: its last bytes) from `file`, open; the sections keep a descriptor of it."""
    try:
        sections_start, columns_start, table_start, _ = _SECTIONS_TRAILER.unpack(trailer)
        if not 0 < sections_start <= columns_start <= table_start <= size - _SECTIONS_TRAILER.size:
            raise ValueError(f"the sections' offsets {sections_start}, {columns_start}, {table_start} are not "
                             f"in order within the file ({size} bytes)")
        file.seek(table_start)
        table = json.loads(file.read(size - _SECTIONS_TRAILER.size - table_start))
        if (not isinstance(table, list) or not all(
                isinstance(row, list) and len(row) == 3 and all(isinstance(n, int) and n >= 0 for n in row)
                for row in table)
                or any(sections_start + offset + length > columns_start for offset, length, _ in table)):
            raise ValueError("the sections' table is not [[offset, length, entries], ...] within the sections")
        file.seek(0)
        state = json.loads(file.read(sections_start - 1))
        state_file = _StateFile(os.dup(file.fileno()), columns_start, table_start)
        sections = [SavedLines(state_file, sections_start + offset, length, count) for offset, length, count in table]

        def section(index: Any) -> SavedLines:
            if not isinstance(index, int) or not 0 <= index < len(sections):
                raise ValueError(f"a section reference {index!r} is not one of the {len(sections)} sections")
            return sections[index]

        _replace_references(state, {LINES_KEY: section, RAW_KEY: state_file.column})
    except ValueError as error:
        logger.warning("engine state %s is not valid (%s); rebuilding from CR status", path, error)
        return None
    return _checked(path, state)


def _replace_references(document: Any, references: dict[str, Callable[[Any], Any]],
                        strings: Callable[[str], str] | None = None) -> None:
    """Replace each one-key object of the loaded JSON named in `references` (`{"$raw": ...}`, `{"$lines": ...}`)
    with what its function makes of the value; with `strings`, each string value with what that makes of it."""
    pending: list[Any] = [document]
    while pending:
        container = pending.pop()
        keyed = container.items() if isinstance(container, dict) else enumerate(container)
        for key, value in keyed:
            kind = type(value)
            if kind is str:
                if strings is not None:
                    container[key] = strings(value)
            elif kind is dict:
                resolve = references.get(next(iter(value))) if len(value) == 1 else None
                if resolve is not None:
                    container[key] = resolve(next(iter(value.values())))
                else:
                    pending.append(value)
            elif kind is list:
                pending.append(value)


def _raw_range(reference: Any, size: int) -> tuple[int, int]:
    """(offset, length) of a raw column reference, checked to lie within `size` raw bytes; ValueError if not."""
    if (not isinstance(reference, list) or len(reference) != 2
            or not all(isinstance(number, int) and number >= 0 for number in reference) or sum(reference) > size):
        raise ValueError(f"a raw column reference {reference!r} is not within the {size} raw bytes")
    offset, length = reference
    return offset, length
