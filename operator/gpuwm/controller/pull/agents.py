"""Agent discovery and the `/v1/snapshot` puller.

Every status interval the controller pulls each agent concurrently with a timeout and
feeds what came back to the engine. `since` is tracked per agent, so each pull returns
only new samples; an agent whose `seq` went backwards restarted and is read again from
the start. An agent that does not answer yields no samples, so its GPUs become
unmonitored (the engine's rule for gaps), never idle.

What an agent sends is refused where it enters: a snapshot that names another node than
the one pulled is dropped whole (its samples would be booked to the wrong GPUs), and a
sample with NaN or ±Infinity in any number is dropped alone, the rest of its snapshot
kept. Both are counted (`AgentPuller.rejected_snapshots`, `.rejected_samples`) and logged.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import ssl
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from hashlib import blake2b
from operator import attrgetter
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp
import numpy
import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from yarl import URL

from gpuwm import __version__
from gpuwm.accounting import Engine
from gpuwm.agent.columns import DEVICES_TAG_MAX_LENGTH, DEVICES_TAG_PARAM
from gpuwm.agent.merge import MergeRequest
from gpuwm.controller.pull.columns import (
    DeviceEntry,
    SampleColumns,
    concat,
    device_entries,
    join,
    parse_columns,
    parse_columns_many,
)
from gpuwm.model.compact import intern_strings, share_fields_set
from gpuwm.model.podstats import PodStatsSample
from gpuwm.model.sample import GpuSample

logger = logging.getLogger(__name__)

_sample_time = attrgetter("t")


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
        # kept until the node's devices change: one fields-set for all alike (~0.7 KiB each), strings shared
        holder = intern_strings(share_fields_set(DeviceHolder.model_validate(flat)))
        return [holder] if holder.pod_key else []
    holders = []
    for inner in nested:
        merged = {**{k: v for k, v in flat.items() if k not in {"holders", "pods", "allocations"}},
                  **{_ALIASES.get(key, key): value for key, value in inner.items()}}
        holder = intern_strings(share_fields_set(DeviceHolder.model_validate(merged)))
        if holder.pod_key:
            holders.append(holder)
    return holders


@dataclass
class Snapshot:
    """What one pull of one agent returned."""

    node: str
    seq: int
    agent_id: str | None
    samples: list[GpuSample]
    holders: list[DeviceHolder]
    pod_stats: list[PodStatsSample]
    more: bool = False  # the agent has records past `seq` (it pages large backlogs)
    truncated: bool = False  # records after `since` had already left the agent's buffer
    columns: SampleColumns | None = None  # the samples, from an agent that answered `format=columns`
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
        return len(self.samples) + (len(self.columns) if self.columns is not None else 0)

    @property
    def max_seq(self) -> int:
        """The highest `seq` among its records (0 without any)."""
        return max(self.seq, max((s.seq or 0 for s in self.samples), default=0),
                   max((s.seq or 0 for s in self.pod_stats), default=0),
                   self.columns.max_seq if self.columns is not None else 0)

    def extend(self, following: Snapshot) -> Snapshot:
        """The next page of the same pull: `following` with this page's records in front."""
        following.samples[:0] = self.samples
        following.pod_stats[:0] = self.pod_stats
        following.truncated = following.truncated or self.truncated
        if self.columns is not None:
            following.columns = self.columns if following.columns is None else concat(self.columns, following.columns)
        following.pending_columns[:0] = self.pending_columns
        following.rejected_samples += self.rejected_samples
        return following


class _SnapshotPayload(BaseModel):
    """The agent's JSON, validated in one pass from bytes (pydantic-core parses and checks in Rust)."""

    model_config = ConfigDict(extra="ignore")

    node: str | None = None
    seq: int = Field(default=0, ge=0)
    agent_id: str | None = None
    more: bool = False
    truncated: bool = False
    samples: list[GpuSample] = Field(default_factory=list)
    pod_stats: list[PodStatsSample] = Field(default_factory=list)
    devices: list[dict[str, Any]] = Field(default_factory=list)


#: agent's node -> (node it reported, a digest of its last `devices` list's JSON, the holders built from them):
#: most pulls repeat it. A digest, not the parsed list: at 1,000 nodes the parsed dicts were ~6 MiB of the
#: controller's RSS (and orjson's output ~8 KiB a node: its buffer, not the JSON's length)
HolderCache = dict[str, tuple[str, bytes, list[DeviceHolder]]]


class _ColumnsEnvelope(BaseModel):
    """A `format=columns` snapshot's members besides the samples (parsed by `parse_columns`)."""

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
    answer (`devices_unchanged`), and these are used (see `gpuwm.agent.columns.devices_members`).
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
_SAMPLE_MEMBERS = ("samples", "pod_stats")


class WrongNodeError(ValueError):
    """An agent answered for another node than the one pulled (a stale address, a mixed-up static list)."""


def _loads(payload: bytes | bytearray) -> Any:
    """An agent's JSON. orjson refuses `NaN` and `Infinity` tokens and numbers that overflow (1e999) outright;
    such an answer is read again by Python's reader, every token that is not a finite number as infinity: in the
    columns NaN stands for null, and the samples that hold infinity are dropped (`gpuwm.controller.pull.columns`)."""
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


_Payload = TypeVar("_Payload", bound=BaseModel)


def _validated(
    adapter: Callable[[Any], _Payload], payload: Mapping[str, Any] | bytes | bytearray
) -> tuple[_Payload, int]:
    """`adapter(payload)`, and where only samples with a number that is not finite are wrong, those samples left
    out: (the payload validated, how many were left out). Other errors are raised as they are."""
    try:
        return adapter(payload), 0
    except ValidationError as error:
        dropped = _not_finite_entries(error)
        if dropped is None:
            raise
    raw = dict(_loads(payload) if isinstance(payload, bytes | bytearray) else payload)
    for member in _SAMPLE_MEMBERS:
        entries = raw.get(member)
        if isinstance(entries, list):
            raw[member] = [entry for position, entry in enumerate(entries) if (member, position) not in dropped]
    return adapter(raw), len(dropped)


def _json_rows(payload: Mapping[str, Any] | bytes | bytearray) -> _SnapshotPayload:
    if isinstance(payload, bytes | bytearray):
        return _SnapshotPayload.model_validate_json(payload)
    return _SnapshotPayload.model_validate(payload)


def _infinity_for_nan(payload: Mapping[str, Any]) -> Mapping[str, Any]:
    """A columnar answer given as objects, a float NaN in its columns made infinity, as `_loads` reads a `NaN`
    token (in the arrays NaN means null). Not on the pull's path: an agent's answer comes as bytes."""
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
    payload: _SnapshotPayload | _ColumnsEnvelope, expected_node: str, holder_cache: HolderCache | None = None,
    columns: SampleColumns | None = None, pending_columns: list[Mapping[str, Any]] | None = None,
    known: KnownDevices | None = None, rejected_samples: int = 0,
) -> Snapshot:
    node = payload.node or expected_node
    if node != expected_node:
        raise WrongNodeError(f"the agent pulled for node {expected_node!r} answered for node {node!r}")
    if known is not None:  # the agent left its devices out: they are those the puller keeps
        holders = known.holders
    else:
        holders = _holders_of(payload.devices, node, expected_node, holder_cache)
    samples = payload.samples if isinstance(payload, _SnapshotPayload) else []
    return Snapshot(node=node, seq=payload.seq, agent_id=payload.agent_id, samples=samples, holders=holders,
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

    Either form: samples as rows (pydantic validates each), or as columns (`"format": "columns"`,
    read into numpy arrays by `parse_columns`; no object per sample). `holder_cache` (kept by the
    puller) skips re-validating device holders an agent repeats unchanged. `defer_columns`: the
    columns are left unread in `pending_columns` (all else is checked), for `ColumnBatch`.
    `known`: the devices the puller keeps for this agent, what an answer with `devices_unchanged` means.
    A sample with NaN or ±Infinity in a number is left out (`Snapshot.rejected_samples` counts it);
    an answer for another node than `expected_node` raises WrongNodeError.
    """
    try:
        if isinstance(payload, bytes | bytearray):
            if b'"columns"' not in payload:  # rows: pydantic parses and checks them in one pass
                rows, rejected = _validated(_json_rows, payload)
                return _snapshot(rows, expected_node, holder_cache, rejected_samples=rejected)
            payload = _loads(payload)
        elif isinstance(payload, Mapping) and payload.get("format") == "columns":
            payload = _infinity_for_nan(payload)
        if not isinstance(payload, Mapping):
            raise ValueError(f"expected a JSON object, got {type(payload).__name__}")
        if payload.get("format") == "columns":
            envelope, rejected = _validated(
                _ENVELOPE.validate_python, {key: payload[key] for key in _ENVELOPE_FIELDS if key in payload})
            held, entries = _tagged_devices(envelope, payload, expected_node, known)
            if entries is not None:  # validated once here; the columns' reading takes them as they are
                payload = {**payload, "gpus": entries}
            if defer_columns:
                snapshot = _snapshot(envelope, expected_node, holder_cache, pending_columns=[payload], known=held,
                                     rejected_samples=rejected)
            else:
                snapshot = _snapshot(envelope, expected_node, holder_cache, parse_columns(payload), known=held,
                                     rejected_samples=rejected)
            snapshot.devices_tag, snapshot.device_entries = envelope.devices_tag, entries
            return snapshot
        rows, rejected = _validated(_json_rows, payload)
        return _snapshot(rows, expected_node, holder_cache, rejected_samples=rejected)
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


@dataclass(frozen=True)
class StaticAgents:
    """`static:NODE=URL,...`: fixed agent URLs (tests, agents outside Kubernetes)."""

    urls: Mapping[str, str]


@dataclass(frozen=True)
class PodAgents:
    """`pods:NAMESPACE/LABELSELECTOR`: the agent DaemonSet's pods, found through the pods watch."""

    namespace: str
    label_selector: str
    port: int = 9400

    def matches(self, namespace: str | None, labels: Mapping[str, str]) -> bool:
        """Whether a pod with these labels is one of the agents (equality selectors, comma-separated)."""
        if namespace != self.namespace:
            return False
        for requirement in filter(None, (part.strip() for part in self.label_selector.split(","))):
            key, _, value = requirement.partition("=")
            key, value = key.rstrip("!"), value.lstrip("=")
            if requirement.count("!=") == 1:
                if labels.get(key) == value:
                    return False
            elif "=" in requirement:
                if labels.get(key) != value:
                    return False
            elif key not in labels:
                return False
        return True


def parse_agents_spec(spec: str, default_port: int = 9400) -> StaticAgents | PodAgents:
    """Parse `--agents`; raises ValueError saying what the two accepted forms are."""
    kind, _, rest = spec.partition(":")
    if kind == "static":
        urls: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in rest.split(","))):
            node, sep, url = item.partition("=")
            if not sep or not node or not url.startswith(("http://", "https://")):
                raise ValueError(f"--agents static entry {item!r} is not NODE=http://HOST:PORT")
            urls[node] = url.rstrip("/")
        if not urls:
            raise ValueError("--agents static: needs at least one NODE=URL")
        return StaticAgents(urls)
    if kind == "pods":
        namespace, sep, selector = rest.partition("/")
        if not sep or not namespace or not selector:
            raise ValueError(f"--agents {spec!r}: expected pods:NAMESPACE/LABELSELECTOR")
        return PodAgents(namespace, selector, default_port)
    raise ValueError(f"--agents {spec!r}: expected pods:NAMESPACE/LABELSELECTOR or static:NODE=URL,...")


@dataclass
class AgentState:
    since: int = 0
    agent_id: str | None = None
    last_success: float | None = None
    failures: int = 0
    warned: bool = False


@dataclass
class PullResult:
    snapshots: list[Snapshot] = field(default_factory=list)
    failed_nodes: list[str] = field(default_factory=list)


#: pages of one agent read in one pull; the rest waits for the next interval
MAX_PAGES_PER_PULL = 20
#: reasons of `AgentPuller.rejected_samples` and `.rejected_snapshots`
NOT_FINITE = "not-finite"
WRONG_NODE = "wrong-node"


class ColumnBatch:
    """Agents' `format=columns` pages read together (`parse_columns_many`), not one agent at a time.

    A pull's snapshot waits here once all its pages are in. The waiting pages are read when
    they reach `BATCH_ROWS` rows, or when no other pull of the round is still fetching: a slow
    or dead agent holds up only its own pull (its connection slot is free meanwhile). A page
    that is malformed fails its own agent only, with the error `parse_snapshot` would give.
    """

    #: rows read at once; ~85 agents of 24 rows (a 15 s pull merged): numpy's fixed cost paid once for them
    BATCH_ROWS = 2048

    def __init__(self) -> None:
        self._fetching = 0
        self._waiting: list[tuple[str, Snapshot, asyncio.Future[None]]] = []
        self._rows = 0

    def started(self) -> None:
        """A pull began (each pull then calls `read` or `stopped`, once)."""
        self._fetching += 1

    def stopped(self) -> None:
        """A pull that will not wait here ended (it failed, or had no columns)."""
        self._fetching -= 1
        if self._fetching <= 0 and self._waiting:
            self._read()

    async def read(self, node: str, snapshot: Snapshot) -> None:
        """Fill `snapshot.columns` from its pending pages; ValueError naming `node` for a malformed one."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((node, snapshot, future))
        self._rows += sum(map(_page_rows, snapshot.pending_columns))
        self._fetching -= 1
        if self._rows >= self.BATCH_ROWS or self._fetching <= 0:
            self._read()
        await future

    def _read(self) -> None:
        waiting, self._waiting, self._rows = self._waiting, [], 0
        pages = [page for _, snapshot, _ in waiting for page in snapshot.pending_columns]
        try:
            results = parse_columns_many(pages)
        except Exception as error:  # not expected (each page's own errors are results): no pull may wait forever,
            for node, _, future in waiting:  # and each fails as its agent, not the whole pull
                if not future.done():
                    future.set_exception(ValueError(f"the snapshot of node {node!r} could not be read: {error!r}"))
            return
        position = 0
        for node, snapshot, future in waiting:
            mine = results[position : position + len(snapshot.pending_columns)]
            position += len(snapshot.pending_columns)
            snapshot.pending_columns = []
            if future.done():  # its pull was cancelled
                continue
            failure = next((result for result in mine if isinstance(result, ValueError)), None)
            if failure is not None:
                future.set_exception(ValueError(f"agent for node {node!r} sent a malformed snapshot: {failure}"))
                continue
            parts = [result for result in mine if isinstance(result, SampleColumns)]
            snapshot.rejected_samples += sum(part.rejected_rows for part in parts)
            if snapshot.columns is not None:
                parts.insert(0, snapshot.columns)
            snapshot.columns = join(parts)
            future.set_result(None)


def _page_rows(page: Mapping[str, Any]) -> int:
    """A columnar page's row count as sent (0 where it is not even shaped as one: its reading says why)."""
    columns = page.get("columns")
    times = columns.get("t") if isinstance(columns, dict) else None
    return len(times) if isinstance(times, list) else 0


#: the largest body read from one agent: a page of the agent's feed is at most a few MB
MAX_BODY_BYTES = 256 * 2**20


class AgentHttpError(Exception):
    """A pull that failed below HTTP (no connection, a malformed or cut answer, a body over the limit); names the URL."""


class AgentPuller:
    """Pulls every agent's `/v1/snapshot?since=SEQ` concurrently, each with a timeout.

    The requests go through one `aiohttp.ClientSession` (created on the first pull, inside the
    event loop) whose connector keeps one connection per agent alive between pulls.
    """

    def __init__(self, timeout_seconds: float = 5.0, max_concurrency: int = 64, keepalive_seconds: float = 60.0,
                 merge: MergeRequest | None = None, max_body_bytes: int = MAX_BODY_BYTES,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self._limit = asyncio.Semaphore(max_concurrency)
        self._max_concurrency = max_concurrency
        self._timeout_seconds = timeout_seconds
        #: idle connections live longer than a status interval (aiohttp's 15 s default is one interval, so
        #: every pull would pay a new TCP connection); the connector closes those idle for longer itself
        self._keepalive_seconds = keepalive_seconds
        self._max_body_bytes = max_body_bytes
        self._ssl: ssl.SSLContext | bool = True if ssl_context is None else ssl_context  # https: system CAs by default
        self._session: aiohttp.ClientSession | None = None
        #: what the agents are asked to merge (gpuwm.agent.merge); an agent that does not know it sends every poll
        self._query_tail = "&format=columns" + ("" if merge is None else merge.query())
        self.state: dict[str, AgentState] = {}
        self._holder_cache: HolderCache = {}
        #: each agent's devices under the tag it gave them: asked for with it, an agent leaves them out unchanged
        self._known_devices: dict[str, KnownDevices] = {}
        #: samples and snapshots refused since the start, by reason (`gpuwm.controller.pull.intake_metrics` exports them)
        self.rejected_samples: Counter[str] = Counter()
        self.rejected_snapshots: Counter[str] = Counter()

    def session(self) -> aiohttp.ClientSession:
        """The agents' HTTP session, made on first use (aiohttp wants a running event loop for it)."""
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._max_concurrency, keepalive_timeout=self._keepalive_seconds,
                                             ssl=self._ssl)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self._timeout_seconds),
                headers={"Accept": "application/json", "User-Agent": f"gpuwm-controller/{__version__}"},
                cookie_jar=aiohttp.DummyCookieJar(),  # agents set none; nothing to keep per answer
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def get(self, base_url: str, target: str) -> tuple[int, bytes]:
        """(status, body) of GET `base_url` + `target`; raises AgentHttpError or TimeoutError naming the URL.

        `base_url` may carry a path prefix. `target` is a path and a query the puller encoded
        itself (`quote`), so the URL goes to aiohttp as encoded, not quoted a second time.
        """
        url = base_url.rstrip("/") + target
        try:
            async with self.session().get(URL(url, encoded=True)) as response:
                length = response.content_length
                if length is not None and length > self._max_body_bytes:
                    raise AgentHttpError(f"{url}: a body of {length} bytes is over the limit of {self._max_body_bytes}")
                body = bytearray()
                async for chunk in response.content.iter_any():
                    body += chunk
                    if len(body) > self._max_body_bytes:
                        raise AgentHttpError(f"{url}: the body is over the limit of {self._max_body_bytes} bytes")
                return response.status, bytes(body)
        except TimeoutError as error:  # before ClientError: aiohttp's socket timeouts are both
            raise TimeoutError(f"{url}: no whole answer within {self._timeout_seconds:g} s") from error
        except (aiohttp.ClientError, ValueError) as error:  # ValueError: yarl's, for a malformed base URL
            raise AgentHttpError(f"{url}: {type(error).__name__}: {error}") from error

    def restore_positions(self, positions: Mapping[str, Any]) -> None:
        """Resume from saved positions, so samples already accounted for are not fed twice."""
        for node, position in positions.items():
            state = self.state.setdefault(node, AgentState())
            if isinstance(position, Mapping):
                state.since, state.agent_id = int(position.get("since") or 0), position.get("agent_id")
            else:
                state.since = int(position)

    def positions(self) -> dict[str, dict[str, Any]]:
        return {node: {"since": state.since, "agent_id": state.agent_id} for node, state in self.state.items()}

    async def pull_all(
        self, agents: Mapping[str, str], on_snapshot: Callable[[Snapshot], None] | None = None
    ) -> PullResult:
        """One pull of every agent in `agents` (node -> base URL).

        With `on_snapshot`, each agent's snapshot is handed to it as soon as it arrives (its
        samples in time order) and the result keeps the snapshot without its samples: at 1 Hz
        a 1,000-node pull is ~10^5 samples, which the controller feeds to the engine as they
        come instead of holding them all (hundreds of MiB) until the last agent answered.
        """
        nodes = sorted(agents)
        for gone in self._holder_cache.keys() - agents.keys():
            del self._holder_cache[gone]
        for gone in self._known_devices.keys() - agents.keys():
            del self._known_devices[gone]
        batch = ColumnBatch()
        outcomes = await asyncio.gather(*(self._pull(node, agents[node], on_snapshot, batch) for node in nodes))
        result = PullResult()
        for node, outcome in zip(nodes, outcomes, strict=True):
            if outcome is None:
                result.failed_nodes.append(node)
            else:
                result.snapshots.append(outcome)
        return result

    async def _pull(
        self, node: str, base_url: str, on_snapshot: Callable[[Snapshot], None] | None = None,
        batch: ColumnBatch | None = None,
    ) -> Snapshot | None:
        state = self.state.setdefault(node, AgentState())
        batch = batch if batch is not None else ColumnBatch()
        batch.started()
        waiting = False
        try:
            async with self._limit:
                try:
                    snapshot = await self._fetch(node, base_url, state.since)
                    restarted = snapshot.seq < state.since or (
                        state.agent_id is not None and snapshot.agent_id is not None
                        and snapshot.agent_id != state.agent_id
                    )
                    if restarted:  # its sequence began again: read it from the start
                        logger.info("agent on %s restarted (seq %d, was %d); reading it from the start",
                                    node, snapshot.seq, state.since, extra={"node": node})
                        snapshot = await self._fetch(node, base_url, 0)
                    pages = 1
                    while snapshot.more and pages < MAX_PAGES_PER_PULL:  # the agent pages large backlogs
                        snapshot, pages = snapshot.extend(await self._fetch(node, base_url, snapshot.seq)), pages + 1
                except (TimeoutError, AgentHttpError, OSError, ValueError) as error:
                    self._failed(node, base_url, error)
                    return None
            if snapshot.pending_columns:  # read with other agents' pages, outside the connection slots
                waiting = True
                try:
                    await batch.read(node, snapshot)
                except ValueError as error:
                    self._failed(node, base_url, error)
                    return None
        finally:
            if not waiting:
                batch.stopped()
        if snapshot.truncated:
            logger.warning("agent on %s dropped samples before the controller read them (seq %d); "
                           "that time is unmonitored", node, state.since, extra={"node": node})
        if snapshot.rejected_samples:  # one line for the pull, however many
            self.rejected_samples[NOT_FINITE] += snapshot.rejected_samples
            logger.warning("agent on %s at %s sent %d samples with NaN or infinity in a number; they were dropped "
                           "(their time is unmonitored), the rest of its snapshot kept", node, base_url,
                           snapshot.rejected_samples, extra={"node": node, "url": base_url})
        if state.warned:
            logger.info("agent on %s answers again", node, extra={"node": node})
        state.since = snapshot.max_seq
        state.agent_id = snapshot.agent_id
        state.last_success = time.time()
        state.failures = 0
        state.warned = False
        if on_snapshot is not None:
            snapshot.samples.sort(key=_sample_time)  # an agent serves in seq order; the engine wants time order
            on_snapshot(snapshot)  # columns: `SampleIntake.take` puts them in time order
            snapshot.samples, snapshot.columns = [], None
        return snapshot

    def _failed(self, node: str, base_url: str, error: BaseException) -> None:
        """An agent that did not answer, or answered something malformed: its GPUs are unmonitored, one warning.

        Its kept devices go too: its next answer sends them again, whatever went wrong.
        """
        self._known_devices.pop(node, None)
        if isinstance(error, WrongNodeError):
            self.rejected_snapshots[WRONG_NODE] += 1
        state = self.state[node]
        state.failures += 1
        if not state.warned:  # one warning per outage, not one per interval
            if isinstance(error, WrongNodeError):
                logger.warning("%s; its snapshots are dropped and the GPUs of %s unmonitored until it answers for "
                               "%s (check --agents)", error, node, node, extra={"node": node, "url": base_url})
            else:
                logger.warning("agent on %s at %s did not answer (%r); its GPUs are unmonitored until it does",
                               node, base_url, error, extra={"node": node, "url": base_url})
            state.warned = True
        return None

    async def _fetch(self, node: str, base_url: str, since: int) -> Snapshot:
        # an agent older than the columnar feed ignores `format` and answers rows: parse_snapshot reads both
        known = self._known_devices.get(node)
        tag = "" if known is None else known.query
        status, payload = await self.get(base_url, f"/v1/snapshot?since={since}{self._query_tail}{tag}")
        if status != 200:
            raise ValueError(f"HTTP {status} from {base_url}/v1/snapshot")
        snapshot = parse_snapshot(payload, node, self._holder_cache, defer_columns=True, known=known)
        if (snapshot.devices_tag is not None and snapshot.device_entries is not None
                and len(snapshot.devices_tag) <= DEVICES_TAG_MAX_LENGTH):
            if known is None or known.tag != snapshot.devices_tag:
                self._known_devices[node] = KnownDevices(snapshot.devices_tag, snapshot.node, snapshot.device_entries,
                                                         snapshot.holders)
        else:  # an agent without tags (or with one too long to send back): it sends them every time
            self._known_devices.pop(node, None)
        return snapshot


def agent_url_of_pod(pod: Mapping[str, Any], port: int) -> tuple[str, str] | None:
    """(node, URL) of a running agent pod, or None while it has no IP."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    node, ip = spec.get("nodeName"), status.get("podIP")
    if not node or not ip or status.get("phase") != "Running":
        return None
    host = f"[{ip}]" if ":" in str(ip) else str(ip)
    declared = [p for c in spec.get("containers") or [] for p in c.get("ports") or [] if p.get("containerPort")]
    named = [p for p in declared if p.get("name") in {"http", "metrics", "agent"}]
    if named or declared:  # the port the agent pod declares wins over the default
        port = int((named or declared)[0]["containerPort"])
    return str(node), f"http://{host}:{port}"


class SampleIntake:
    """Feeds the agents' snapshots to the engine as they arrive (see `AgentPuller.pull_all`).

    Keeps what the rest of the cycle needs of the samples: each device's latest one (what the
    store's rows and the CR's `gpus[]` read), the newest sample time, and the nodes whose
    device holders changed. Samples of one agent go in time order; the engine places
    samples of different agents exactly whatever their order (within its late window).

    Columnar snapshots wait (as arrays, ~0.1 KiB a sample) until `flush()` or until
    `FLUSH_ROWS` are waiting, and go to the engine as one batch: its vectorised path pays
    for its fixed cost over many agents, not per agent. The engine sees the same samples in
    the same order as one snapshot at a time. Call `flush()` once the pull is done.
    """

    #: a batch this long amortises numpy's fixed cost; the whole pull at once (120,000 rows at 1 Hz) raised the
    #: controller's peak RSS by ~90 MiB (the engine's per-row intermediates), 40,000 by ~35 MiB; 10,000 (a merged
    #: pull of 1,000 nodes in 3 batches) by ~12 MiB; 5,000 by ~9, at the same CPU per cycle each time
    #: (bench/controller.py --phase-peaks)
    FLUSH_ROWS = 5_000

    def __init__(self, engine: Engine, holders_by_node: dict[str, list[DeviceHolder]] | None = None) -> None:
        self.engine = engine
        self.holders_by_node = {} if holders_by_node is None else holders_by_node
        self.latest: dict[str, GpuSample] = {}
        self.latest_time: float | None = None
        self.changed_nodes: set[str] = set()
        self.samples = 0
        self.cpu_seconds = 0.0
        self._waiting: list[SampleColumns] = []
        self._waiting_rows = 0

    def take(self, snapshot: Snapshot) -> None:
        started = time.thread_time()
        known_holders = self.holders_by_node.get(snapshot.node)
        if snapshot.holders is not known_holders:
            if snapshot.holders != known_holders:
                self.changed_nodes.add(snapshot.node)
            # kept even when equal: the puller hands back the same list while the agent's devices do not change,
            # so later pulls compare by identity. Restored holders (a restart) are equal, not the same: kept,
            # they cost a field-by-field comparison of every holder on every pull (~0.05 CPU-s at 8,000 GPUs)
            self.holders_by_node[snapshot.node] = snapshot.holders
        if snapshot.samples:
            self._flush()  # what came earlier goes in first
            observe, latest = self.engine.observe_sample, self.latest
            for sample in snapshot.samples:
                observe(sample)
                known = latest.get(sample.uuid)
                if known is None or sample.t >= known.t:
                    latest[sample.uuid] = sample
            self.samples += len(snapshot.samples)
            self._newest(snapshot.samples[-1].t)
        if snapshot.columns is not None and len(snapshot.columns):
            columns = snapshot.columns
            if not columns.in_time_order():  # an agent serves in seq order; the engine wants time order
                columns = columns.take(columns.time_order())
            self._waiting.append(columns)
            self._waiting_rows += len(columns)
            if self._waiting_rows >= self.FLUSH_ROWS:
                self._flush()
        self.cpu_seconds += time.thread_time() - started

    def flush(self) -> None:
        """Feed the engine what waits; the pull is over (or the next rows must go after these)."""
        started = time.thread_time()
        self._flush()
        self.cpu_seconds += time.thread_time() - started

    def _flush(self) -> None:
        if not self._waiting:
            return
        columns = join(self._waiting)
        self._waiting, self._waiting_rows = [], 0
        built: dict[int, GpuSample] = {}

        def sample(row: int) -> GpuSample:  # the engine and `latest` share one object per row
            found = built.get(row)
            if found is None:
                found = built[row] = columns.sample(row)
            return found

        identity = numpy.arange(len(columns), dtype=numpy.int64)
        uuids = [device.uuid for device in columns.devices]
        by_uuid = {uuid: position for position, uuid in enumerate(dict.fromkeys(uuids))}
        ids = numpy.array([by_uuid[uuid] for uuid in uuids], dtype=numpy.int64)[columns.gpu]
        # each device's latest: its latest time, of equal times the later row (as `t >= known.t` row by row);
        # built at once, before the engine asks for (mostly) the same rows
        ranked = numpy.lexsort((identity, columns.t, ids))
        last = ranked[numpy.flatnonzero(numpy.append(ids[ranked][1:] != ids[ranked][:-1], True))].tolist()
        built.update(zip(last, columns.samples(last), strict=True))
        batch = columns.batch(identity)
        self.engine.observe_samples(replace(batch, sample=sample))
        latest, ts = self.latest, batch.t
        for row in last:
            uuid = uuids[int(columns.gpu[row])]
            known = latest.get(uuid)
            if known is None or ts[row] >= known.t:
                latest[uuid] = sample(row)
        self.samples += len(ids)
        self._newest(float(columns.t.max()))

    def _newest(self, t: float) -> None:
        if self.latest_time is None or t > self.latest_time:
            self.latest_time = t


def sorted_samples(snapshots: Sequence[Snapshot]) -> list[GpuSample]:
    """All samples of one pull in time order, the order the engine wants them (columns made GpuSample objects)."""
    samples = [sample for snap in snapshots for sample in snap.samples]
    for snap in snapshots:
        if snap.columns is not None:
            samples += snap.columns.samples(list(range(len(snap.columns))))
    return sorted(samples, key=_sample_time)


def index_holders(holders_by_node: Mapping[str, list[DeviceHolder]]) -> dict[str, list[DeviceHolder]]:
    """Holders by pod, under each name the agent gave (UID and namespace/name): one holder may be listed twice."""
    by_pod: dict[str, list[DeviceHolder]] = {}
    for holders in holders_by_node.values():
        for holder in holders:
            for key in holder.pod_keys:
                by_pod.setdefault(key, []).append(holder)
    return by_pod
