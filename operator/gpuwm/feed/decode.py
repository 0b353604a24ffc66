"""The feed's decoder: an agent's answer to `/v1/snapshot` read into what the controller keeps (docs/snapshot-feed.md).

`parse_snapshot` checks the envelope, reads the device holders from `devices` (or takes the
ones the puller keeps, while the agent says they are unchanged under their `devices_tag`) and
the samples, in columns (`format=columns`), into numpy arrays (`gpuwm.feed.arrays`, into `gpuwm.feed.columns`), not one
object per sample. `ColumnBatch` reads the columns of many agents' answers together.

The controller reads one form, the columns it asks for. Rows (`format=rows`, the agent's
default, for people: `curl | jq`) are refused whole (`FormatError`), as anything else that is
not columns: an agent that answers them does not know `format` (one older than the columnar
feed), and a second reader for them would be a second decoder to keep equal to the first.

What an agent sends is refused where it enters: a snapshot that names another node than the
one pulled is dropped whole (`WrongNodeError`: its samples would be booked to the wrong GPUs),
and a sample with NaN or ±Infinity in any number is dropped alone, the rest of its snapshot
kept (`Snapshot.rejected_samples` counts it).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from hashlib import blake2b
from typing import Any
from urllib.parse import quote

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from gpuwm.feed.arrays import device_entries, parse_columns, parse_columns_many
from gpuwm.feed.columns import DeviceEntry, SampleColumns, join
from gpuwm.feed.schema import DEVICES_TAG_PARAM
from gpuwm.model import PodStatsSample, intern_strings

__all__ = [
    "COLUMNS_FORMAT", "ColumnBatch", "DeviceEntry", "DeviceHolder", "FormatError", "HolderCache", "KnownDevices",
    "SampleColumns", "Snapshot", "WrongNodeError", "join", "parse_columns", "parse_columns_many", "parse_snapshot",
]

#: the one form the controller reads (`?format=columns`, `"format": "columns"` in the answer)
COLUMNS_FORMAT = "columns"


class DeviceHolder(BaseModel):
    """Which pod (and container) holds a device, as the agent learned from the kubelet's pod-resources."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    uuid: str = Field(min_length=1)
    device_id: str | None = None
    node: str | None = None
    pod_uid: str | None = None
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    resource_name: str | None = None
    units: float | None = Field(default=None, gt=0, le=1)

    @property
    def pod_keys(self) -> tuple[str, ...]:
        """How the holder names its pod: its UID (cgroups, kubelet stats) and/or `namespace/name` (pod-resources)."""
        keys = [self.pod_uid] if self.pod_uid else []
        if self.namespace and self.pod:
            keys.append(f"{self.namespace}/{self.pod}")
        return tuple(keys)

    @property
    def pod_key(self) -> str | None:
        return self.pod_keys[0] if self.pod_keys else None


_ALIASES = {
    "podUid": "pod_uid", "podUID": "pod_uid", "pod_name": "pod", "podName": "pod", "pod_namespace": "namespace",
    "resourceName": "resource_name", "resource": "resource_name", "device_uuid": "uuid", "deviceUuid": "uuid",
}


def _holders(entry: Mapping[str, Any], node: str) -> list[DeviceHolder]:
    """One device entry -> its holders: a flat entry, or one with a nested list of pods."""
    flat = {_ALIASES.get(key, key): value for key, value in entry.items()}
    flat.setdefault("node", node)
    nested = next((flat[key] for key in ("holders", "pods", "allocations") if isinstance(flat.get(key), list)), None)
    if nested is None:
        entries = [flat]
    else:
        device = {k: v for k, v in flat.items() if k not in {"holders", "pods", "allocations"}}
        entries = [{**device, **{_ALIASES.get(key, key): value for key, value in inner.items()}} for inner in nested]
    # kept until the node's devices change: strings shared
    holders = [DeviceHolder.model_validate(intern_strings(held)) for held in entries]
    return [holder for holder in holders if holder.pod_key]


@dataclass
class Snapshot:
    """What one pull of one agent returned."""

    node: str
    seq: int
    agent_id: str | None
    holders: list[DeviceHolder]
    pod_stats: list[PodStatsSample]
    more: bool = False  # the agent has records past `seq` (it pages large backlogs)
    truncated: bool = False  # records after `since` had already left the agent's buffer
    columns: SampleColumns | None = None  # the samples (None while they wait in `pending_columns`, or handed over)
    #: its `format=columns` pages not read yet (`parse_snapshot(defer_columns=True)`), read with other agents' pages
    #: by `ColumnBatch`
    pending_columns: list[Mapping[str, Any]] = field(default_factory=list)
    #: the tag the agent gave its `gpus` and `devices` (columns only), and those `gpus` validated: kept by the puller
    devices_tag: str | None = None
    device_entries: list[DeviceEntry] | None = None
    #: samples (GPU samples and pod stats) dropped for a number that is not finite; the columns' dropped rows are
    #: added when the columns are read (`ColumnBatch`)
    rejected_samples: int = 0

    @property
    def sample_count(self) -> int:
        return len(self.columns) if self.columns is not None else 0

    @property
    def max_seq(self) -> int:
        """The highest `seq` among its records (0 without any)."""
        return max(self.seq, max((s.seq or 0 for s in self.pod_stats), default=0),
                   self.columns.max_seq if self.columns is not None else 0)

    def extend(self, following: Snapshot) -> Snapshot:
        """The next page of the same pull: `following` with this page's records in front."""
        following.pod_stats[:0] = self.pod_stats
        following.truncated = following.truncated or self.truncated
        if self.columns is not None:
            following.columns = self.columns if following.columns is None else join([self.columns, following.columns])
        following.pending_columns[:0] = self.pending_columns
        following.rejected_samples += self.rejected_samples
        return following


#: agent's node -> (node it reported, a digest of its last `devices` list's JSON, the holders built from them):
#: most pulls repeat it. A digest, not the parsed list: kept for every node, the parsed dicts (and orjson's
#: output buffers, larger than the JSON) would be a visible part of the controller's memory
HolderCache = dict[str, tuple[str, bytes, list[DeviceHolder]]]


class _ColumnsEnvelope(BaseModel):
    """A snapshot's members besides the samples' columns (parsed by `parse_columns`)."""

    model_config = ConfigDict(extra="ignore")

    node: str | None = None
    seq: int = Field(default=0, ge=0)
    agent_id: str | None = None
    more: bool = False
    truncated: bool = False
    pod_stats: list[PodStatsSample] = Field(default_factory=list)
    devices: list[dict[str, Any]] = Field(default_factory=list)
    devices_tag: str | None = None
    devices_unchanged: bool = False


@dataclass(frozen=True)
class KnownDevices:
    """An agent's last `gpus` (validated) and device holders, under the tag it gave them (`devices_tag`).

    Sent back as `?devices_tag=`: while they are unchanged the agent leaves them out of its
    answer (`devices_unchanged`), and these are used (see `gpuwm.feed.encode.devices_members`).
    """

    tag: str
    node: str
    device_entries: list[DeviceEntry]
    holders: list[DeviceHolder]

    @functools.cached_property
    def query(self) -> str:
        """`&devices_tag=TAG`, quoted once: a pull asks with it every interval."""
        return f"&{DEVICES_TAG_PARAM}={quote(self.tag, safe='')}"


_ENVELOPE_FIELDS = frozenset(_ColumnsEnvelope.model_fields)
_ENVELOPE = TypeAdapter(_ColumnsEnvelope)
#: the members whose entries are samples: one with a number that is not finite is dropped, not the snapshot
#: (the columns' rows are checked by `gpuwm.feed.arrays`)
_SAMPLE_MEMBERS = ("pod_stats",)


class WrongNodeError(ValueError):
    """An agent answered for another node than the one pulled (a stale address, a mixed-up static list)."""


class FormatError(ValueError):
    """An agent answered in another form than columns: rows (the agent's default, what an agent that does not
    know `?format=` sends) or anything else. Its samples are not read; its GPUs stay unmonitored."""


def _format_of(payload: Mapping[str, Any]) -> str:
    """How an answer names its form, for the refusal: an answer without `format` is rows (the agent's default)."""
    if "format" not in payload:
        return "rows"
    answered = payload["format"]
    return answered if isinstance(answered, str) and answered.isidentifier() else repr(answered)


def _loads(payload: bytes | bytearray) -> Any:
    """An agent's JSON. orjson refuses `NaN` and `Infinity` tokens and numbers that overflow (1e999) outright;
    such an answer is read again by Python's reader, every token that is not a finite number as infinity: in the
    columns NaN stands for null, and the samples that hold infinity are dropped (`gpuwm.feed.arrays`)."""
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return json.loads(payload, parse_constant=lambda _token: math.inf)


def _not_finite_entries(error: ValidationError) -> set[tuple[str, int]] | None:
    """The (member, position) of the samples `error` found a NaN or infinity in; None when it found anything else."""
    found = set()
    for detail in error.errors():
        location = detail["loc"]
        if (detail["type"] != "finite_number" or len(location) < 2 or location[0] not in _SAMPLE_MEMBERS
                or not isinstance(location[1], int)):
            return None
        found.add((str(location[0]), location[1]))
    return found


def _envelope(payload: Mapping[str, Any]) -> tuple[_ColumnsEnvelope, int]:
    """The answer's members besides the columns, validated, and where only entries with a number that is not finite
    are wrong, those entries left out: (the envelope, how many were left out). Other errors are raised as they are."""
    members = {key: payload[key] for key in _ENVELOPE_FIELDS if key in payload}
    try:
        return _ENVELOPE.validate_python(members), 0
    except ValidationError as error:
        dropped = _not_finite_entries(error)
        if dropped is None:
            raise
    for member in _SAMPLE_MEMBERS:
        entries = members.get(member)
        if isinstance(entries, list):
            members[member] = [entry for position, entry in enumerate(entries) if (member, position) not in dropped]
    return _ENVELOPE.validate_python(members), len(dropped)


def _infinity_for_nan(payload: Mapping[str, Any]) -> Mapping[str, Any]:
    """An answer given as objects, a float NaN in its columns made infinity, as `_loads` reads a `NaN` token (in the
    arrays NaN means null). Not on the pull's path: an agent's answer comes as bytes."""
    def marked(values: Any) -> Any:
        if isinstance(values, list) and any(type(value) is float and value != value for value in values):
            return [math.inf if type(value) is float and value != value else value for value in values]
        return values

    changed = dict(payload)
    for member in ("columns", "processes"):
        if isinstance(payload.get(member), Mapping):
            changed[member] = {name: marked(values) for name, values in payload[member].items()}
    return changed


def _snapshot(
    payload: _ColumnsEnvelope, expected_node: str, holder_cache: HolderCache | None, columns: SampleColumns | None,
    pending_columns: list[Mapping[str, Any]] | None, known: KnownDevices | None, rejected_samples: int,
) -> Snapshot:
    node = payload.node or expected_node
    if node != expected_node:
        raise WrongNodeError(f"the agent pulled for node {expected_node!r} answered for node {node!r}")
    if known is not None:  # the agent left its devices out: they are those the puller keeps
        holders = known.holders
    else:
        holders = _holders_of(payload.devices, node, expected_node, holder_cache)
    return Snapshot(node=node, seq=payload.seq, agent_id=payload.agent_id, holders=holders,
                    pod_stats=payload.pod_stats, more=payload.more, truncated=payload.truncated, columns=columns,
                    pending_columns=pending_columns or [],
                    rejected_samples=rejected_samples + (columns.rejected_rows if columns is not None else 0))


def _holders_of(
    devices: list[dict[str, Any]], node: str, expected_node: str, holder_cache: HolderCache | None
) -> list[DeviceHolder]:
    """The holders an answer's `devices` name: the cached list while the agent repeats them unchanged."""
    cached = holder_cache.get(expected_node) if holder_cache is not None else None
    digest = blake2b(orjson.dumps(devices), digest_size=16).digest() if holder_cache is not None else b""
    if cached is not None and cached[0] == node and cached[1] == digest:
        return cached[2]  # the same list object: the runtime's attribution check sees no change at once
    holders = [holder for item in devices for holder in _holders(item, node)]
    if holder_cache is not None:
        holder_cache[expected_node] = (node, digest, holders)
    return holders


def parse_snapshot(
    payload: Mapping[str, Any] | bytes, expected_node: str, holder_cache: HolderCache | None = None,
    defer_columns: bool = False, known: KnownDevices | None = None,
) -> Snapshot:
    """Validate an agent's JSON (parsed or raw bytes); raises ValueError naming the node and the field at fault.

    The samples come as columns (`"format": "columns"`), read into numpy arrays by
    `parse_columns` (no object per sample); any other form raises FormatError. `holder_cache`
    (kept by the puller) skips re-validating device holders an agent repeats unchanged.
    `defer_columns`: the columns are left unread in `pending_columns` (all else is checked), for
    `ColumnBatch`. `known`: the devices the puller keeps for this agent, what an answer with
    `devices_unchanged` means. A sample with NaN or ±Infinity in a number is left out
    (`Snapshot.rejected_samples` counts it); an answer for another node than `expected_node`
    raises WrongNodeError.
    """
    try:
        if isinstance(payload, bytes | bytearray):
            payload = _loads(payload)
        elif isinstance(payload, Mapping):  # given as objects (tests, tools), not as the agent's bytes
            payload = _infinity_for_nan(payload)
        if not isinstance(payload, Mapping):
            raise ValueError(f"expected a JSON object, got {type(payload).__name__}")
        if payload.get("format") != COLUMNS_FORMAT:
            raise FormatError(f"agent for node {expected_node!r} answered format={_format_of(payload)}; "
                              f"the controller reads format={COLUMNS_FORMAT}")
        envelope, rejected = _envelope(payload)
        held, entries = _tagged_devices(envelope, payload, expected_node, known)
        if entries is not None:  # validated once here; the columns' reading takes them as they are
            payload = {**payload, "gpus": entries}
        snapshot = _snapshot(envelope, expected_node, holder_cache, None if defer_columns else parse_columns(payload),
                             [payload] if defer_columns else None, held, rejected)
        snapshot.devices_tag, snapshot.device_entries = envelope.devices_tag, entries
        return snapshot
    except FormatError:
        raise  # it names the node already
    except WrongNodeError as error:
        raise WrongNodeError(f"agent for node {expected_node!r} sent a snapshot of another node: {error}") from None
    except (ValidationError, TypeError, ValueError, AttributeError, orjson.JSONDecodeError) as error:
        raise ValueError(f"agent for node {expected_node!r} sent a malformed snapshot: {error}") from None


def _tagged_devices(
    envelope: _ColumnsEnvelope, payload: Mapping[str, Any], expected_node: str, known: KnownDevices | None
) -> tuple[KnownDevices | None, list[DeviceEntry] | None]:
    """(the kept devices an answer left out, else None; its `gpus` validated where it has a tag, else None)."""
    if envelope.devices_unchanged:
        node = envelope.node or expected_node
        if known is None or envelope.devices_tag != known.tag or node != known.node:
            held = "none" if known is None else f"{known.tag!r} of node {known.node!r}"
            raise ValueError(f"'devices_unchanged' with devices_tag {envelope.devices_tag!r} of node {node!r}, but the "
                             f"devices held for it are {held}: 'gpus' and 'devices' are needed")
        return known, known.device_entries
    if envelope.devices_tag is None:
        return None, None
    return None, device_entries(payload.get("gpus") or [])


class ColumnBatch:
    """Agents' `format=columns` pages read together (`parse_columns_many`), not one agent at a time.

    A fast twin of reading each answer whole as it arrives (`parse_snapshot`), kept for what it saves of
    the controller's pull at 1,000 agents (`bench/pull.py`); the seeded
    tests in test_columns_feed.py hold the two to the same columns.

    A pull hands its snapshot over once all its pages are in (`add`), with what to do once they
    are read. The waiting pages are read when they reach `BATCH_ROWS` rows, or when no other pull
    of the round is still fetching: a slow or dead agent holds up only its own pull (its connection
    slot is free meanwhile). A page that is malformed fails its own agent only, with the error
    `parse_snapshot` would give.
    """

    #: rows read at once: some 85 agents' merged 15 s pulls, numpy's fixed cost paid once for them
    BATCH_ROWS = 2048

    def __init__(self, fetching: int) -> None:
        """`fetching`: the pulls of the round, each of which then calls `add` or `stopped` once."""
        self._fetching = fetching
        self._waiting: list[tuple[str, Snapshot, Callable[[ValueError | None], None]]] = []
        self._rows = 0

    def stopped(self) -> None:
        """A pull that will not wait here ended (it failed, or had no columns)."""
        self._fetching -= 1
        if self._fetching <= 0 and self._waiting:
            self._read()

    def add(self, node: str, snapshot: Snapshot, then: Callable[[ValueError | None], None]) -> None:
        """Fill `snapshot.columns` from its pending pages, now or with later pulls' pages; then call `then` with
        None, or with a ValueError naming `node` for a malformed page (its snapshot is then not to be used)."""
        self._waiting.append((node, snapshot, then))
        self._rows += sum(map(_page_rows, snapshot.pending_columns))
        self._fetching -= 1
        if self._rows >= self.BATCH_ROWS or self._fetching <= 0:
            self._read()

    def _read(self) -> None:
        waiting, self._waiting, self._rows = self._waiting, [], 0
        pages = [page for _, snapshot, _ in waiting for page in snapshot.pending_columns]
        try:
            results = parse_columns_many(pages)
        except Exception as error:  # not expected (each page's own errors are results): each fails as its agent,
            for node, _, then in waiting:  # not the whole pull
                then(ValueError(f"the snapshot of node {node!r} could not be read: {error!r}"))
            return
        position = 0
        for node, snapshot, then in waiting:
            mine = results[position : position + len(snapshot.pending_columns)]
            position += len(snapshot.pending_columns)
            snapshot.pending_columns = []
            failure = next((result for result in mine if isinstance(result, ValueError)), None)
            if failure is not None:
                then(ValueError(f"agent for node {node!r} sent a malformed snapshot: {failure}"))
                continue
            parts = [result for result in mine if isinstance(result, SampleColumns)]
            snapshot.rejected_samples += sum(part.rejected_rows for part in parts)
            if snapshot.columns is not None:
                parts.insert(0, snapshot.columns)
            snapshot.columns = join(parts)
            then(None)


def _page_rows(page: Mapping[str, Any]) -> int:
    """A columnar page's row count as sent (0 where it is not even shaped as one: its reading says why)."""
    columns = page.get("columns")
    times = columns.get("t") if isinstance(columns, dict) else None
    return len(times) if isinstance(times, list) else 0
