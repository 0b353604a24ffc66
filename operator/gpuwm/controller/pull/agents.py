"""Agent discovery, the `/v1/snapshot` puller and the intake of its samples into the engine.

Every status interval the controller pulls each agent concurrently with a timeout and
feeds what came back to the engine. `since` is tracked per agent, so each pull returns
only new samples; an agent whose `seq` went backwards restarted and is read again from
the start. An agent that does not answer yields no samples, so its GPUs become
unmonitored (the engine's rule for gaps), never idle.

An answer is read by the feed's decoder (`gpuwm.feed.decode`), which refuses what an agent
must not send (another node's snapshot, a sample with NaN or ±Infinity); the puller counts
both (`AgentPuller.rejected_snapshots`, `.rejected_samples`) and logs them.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Any

import aiohttp
import numpy
from yarl import URL

from gpuwm import __version__
from gpuwm.accounting import Engine
from gpuwm.feed import DEVICES_TAG_MAX_LENGTH, MergeRequest
from gpuwm.feed.decode import (
    DeviceHolder,
    HolderCache,
    KnownDevices,
    SampleColumns,
    Snapshot,
    WrongNodeError,
    join,
    parse_columns_many,
    parse_snapshot,
)
from gpuwm.model.sample import GpuSample

logger = logging.getLogger(__name__)

_sample_time = attrgetter("t")


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

    #: rows read at once: some 85 agents' merged 15 s pulls, numpy's fixed cost paid once for them
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
        #: what the agents are asked to merge (gpuwm.feed.merge); an agent that does not know it sends every poll
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
        a 1,000-node pull is a hundred thousand samples, which the controller feeds to the engine
        as they come instead of holding them all until the last agent answered.
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

    Columnar snapshots wait (as arrays, a fraction of a GpuSample each) until `flush()` or until
    `FLUSH_ROWS` are waiting, and go to the engine as one batch: its vectorised path pays
    for its fixed cost over many agents, not per agent. The engine sees the same samples in
    the same order as one snapshot at a time. Call `flush()` once the pull is done.
    """

    #: a batch this long amortises numpy's fixed cost; a longer one raises the controller's peak memory by the
    #: engine's per-row intermediates at no saving of CPU (bench/README.md, bench/controller.py --phase-peaks)
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
            # they cost a field-by-field comparison of every holder on every pull
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
