"""Agent discovery and the `/v1/snapshot` puller.

Every status interval the controller pulls each agent concurrently with a timeout and hands
each agent's snapshot to the intake (`gpuwm.controller.pull.intake`) as it arrives. `since` is tracked per agent, so each pull returns
only new samples; an agent whose `seq` went backwards restarted and is read again from
the start. An agent that does not answer yields no samples, so its GPUs become
unmonitored (the engine's rule for gaps), never idle.

An answer is read by the feed's decoder (`gpuwm.feed.decode`), which refuses what an agent
must not send (an answer in another form than columns, another node's snapshot, a sample with
NaN or ±Infinity); the puller counts them (`AgentPuller.rejected_snapshots`, `.rejected_samples`)
and logs them.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
from yarl import URL

from gpuwm import __version__
from gpuwm.feed import DEVICES_TAG_MAX_LENGTH, MergeRequest
from gpuwm.feed.decode import (
    COLUMNS_FORMAT,
    ColumnBatch,
    DeviceHolder,
    FormatError,
    HolderCache,
    KnownDevices,
    Snapshot,
    WrongNodeError,
    parse_snapshot,
)

logger = logging.getLogger(__name__)


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


def parse_agents_spec(spec: str) -> StaticAgents | PodAgents:
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
        return PodAgents(namespace, selector)
    raise ValueError(f"--agents {spec!r}: expected pods:NAMESPACE/LABELSELECTOR or static:NODE=URL,...")


@dataclass
class AgentState:
    since: int = 0
    agent_id: str | None = None
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
WRONG_FORMAT = "wrong-format"


#: the largest body read from one agent: a page of the agent's feed is at most a few MB
MAX_BODY_BYTES = 256 * 2**20


class AgentHttpError(Exception):
    """A pull that failed below HTTP (no connection, a malformed or cut answer, a body over the limit); names the URL."""


class AgentPuller:
    """Pulls every agent's `/v1/snapshot?since=SEQ` concurrently, each with a timeout.

    The requests go through one `aiohttp.ClientSession` (created on the first pull, inside the
    event loop) whose connector keeps one connection per agent alive between pulls. A pull runs
    `max_concurrency` workers, each asking one agent at a time: a request's timeout starts when
    it is sent, not while it waits for a free connection (with the connector's limit alone, the
    last of a thousand agents would spend its timeout in the connector's queue), and a pull is
    `max_concurrency` tasks, not one per agent.
    """

    def __init__(self, timeout_seconds: float = 5.0, max_concurrency: int = 64,
                 merge: MergeRequest | None = None, max_body_bytes: int = MAX_BODY_BYTES,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency: at least 1 agent is pulled at a time, got {max_concurrency}")
        self._max_concurrency = max_concurrency
        self._timeout_seconds = timeout_seconds
        self._max_body_bytes = max_body_bytes
        self._ssl: ssl.SSLContext | bool = True if ssl_context is None else ssl_context  # https: system CAs by default
        self._session: aiohttp.ClientSession | None = None
        #: what the agents are asked to merge (gpuwm.feed.merge); an agent that does not know it sends every poll
        self._query_tail = _query_tail(merge)
        #: the same with every holder's share whole (`MergeRequest.exact_replicas` 1), for the nodes `pull_all`
        #: names in `whole_devices`
        self._query_tail_whole = _query_tail(None if merge is None else replace(merge, exact_replicas=1))
        self._whole_devices: Collection[str] = ()
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
            # idle connections live longer than a status interval (aiohttp's 15 s default is one interval, so
            # every pull would pay a new TCP connection); the connector closes those idle for longer itself
            connector = aiohttp.TCPConnector(limit=self._max_concurrency, keepalive_timeout=60.0, ssl=self._ssl)
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
        self, agents: Mapping[str, str], on_snapshot: Callable[[Snapshot], None] | None = None,
        whole_devices: Collection[str] = (),
    ) -> PullResult:
        """One pull of every agent in `agents` (node -> base URL).

        `whole_devices`: the nodes whose every device the controller knows to be held whole (see
        `gpuwm.controller.watch.whole_device_nodes`); their agents merge polls without the cap sides only a
        holder of part of a device tells apart.

        With `on_snapshot`, each agent's snapshot is handed to it as soon as it arrives (its
        samples in time order) and the result keeps the snapshot without its samples: at 1 Hz
        a 1,000-node pull is a hundred thousand samples, which the controller feeds to the engine
        as they come instead of holding them all until the last agent answered.
        """
        nodes = sorted(agents)
        self._whole_devices = whole_devices
        for gone in self._holder_cache.keys() - agents.keys():
            del self._holder_cache[gone]
        for gone in self._known_devices.keys() - agents.keys():
            del self._known_devices[gone]
        answered: dict[str, Snapshot] = {}
        batch = ColumnBatch(len(nodes))
        queue = iter(nodes)

        async def worker() -> None:
            for node in queue:  # the next agent not yet asked, in node order
                await self._pull(node, agents[node], batch, answered, on_snapshot)

        # a worker is a connection slot: each agent's request starts its timeout only once it is sent
        await asyncio.gather(*(worker() for _ in range(min(self._max_concurrency, len(nodes)))))
        return PullResult([answered[node] for node in nodes if node in answered],
                          [node for node in nodes if node not in answered])

    async def _pull(
        self, node: str, base_url: str, batch: ColumnBatch, answered: dict[str, Snapshot],
        on_snapshot: Callable[[Snapshot], None] | None,
    ) -> None:
        """Fetch one agent's pages (in a worker's slot); its columns are read with other agents' (`batch`), after
        which `_took` puts its snapshot in `answered`. An agent that fails is left out of `answered`."""
        state = self.state.setdefault(node, AgentState())
        handed_over = False
        try:
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
                return
            if not snapshot.pending_columns:
                self._took(node, base_url, snapshot, answered, on_snapshot)
                return

            def read(error: ValueError | None) -> None:
                if error is None:
                    self._took(node, base_url, snapshot, answered, on_snapshot)
                else:
                    self._failed(node, base_url, error)

            handed_over = True  # read with other agents' pages, outside the connection slots
            batch.add(node, snapshot, read)
        finally:
            if not handed_over:
                batch.stopped()

    def _took(
        self, node: str, base_url: str, snapshot: Snapshot, answered: dict[str, Snapshot],
        on_snapshot: Callable[[Snapshot], None] | None,
    ) -> None:
        """An agent's whole answer, its columns read: its position moves on, the snapshot goes to `on_snapshot`."""
        state = self.state[node]
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
        state.warned = False
        answered[node] = snapshot
        if on_snapshot is not None:
            on_snapshot(snapshot)  # `SampleIntake.take` puts the columns in time order
            snapshot.columns = None

    def _failed(self, node: str, base_url: str, error: BaseException) -> None:
        """An agent that did not answer, or answered something malformed: its GPUs are unmonitored, one warning.

        Its kept devices go too: its next answer sends them again, whatever went wrong.
        """
        self._known_devices.pop(node, None)
        if isinstance(error, WrongNodeError):
            self.rejected_snapshots[WRONG_NODE] += 1
        elif isinstance(error, FormatError):
            self.rejected_snapshots[WRONG_FORMAT] += 1
        state = self.state[node]
        if not state.warned:  # one warning per outage, not one per interval
            if isinstance(error, WrongNodeError):
                logger.warning("%s; its snapshots are dropped and the GPUs of %s unmonitored until it answers for "
                               "%s (check --agents)", error, node, node, extra={"node": node, "url": base_url})
            elif isinstance(error, FormatError):
                logger.warning("%s (%s); its snapshots are dropped and the GPUs of %s unmonitored until it answers "
                               "in columns (an agent older than the columnar feed: upgrade it)", error, base_url,
                               node, extra={"node": node, "url": base_url})
            else:
                logger.warning("agent on %s at %s did not answer (%r); its GPUs are unmonitored until it does",
                               node, base_url, error, extra={"node": node, "url": base_url})
            state.warned = True

    async def _fetch(self, node: str, base_url: str, since: int) -> Snapshot:
        known = self._known_devices.get(node)
        tag = "" if known is None else known.query
        tail = self._query_tail_whole if node in self._whole_devices else self._query_tail
        status, payload = await self.get(base_url, f"/v1/snapshot?since={since}{tail}{tag}")
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


def _query_tail(merge: MergeRequest | None) -> str:
    """What every snapshot request asks besides `since` and a devices tag: columns, and the merge if any."""
    return f"&format={COLUMNS_FORMAT}" + ("" if merge is None else merge.query())


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


def index_holders(holders_by_node: Mapping[str, list[DeviceHolder]]) -> dict[str, list[DeviceHolder]]:
    """Holders by pod, under each name the agent gave (UID and namespace/name): one holder may be listed twice."""
    by_pod: dict[str, list[DeviceHolder]] = {}
    for holders in holders_by_node.values():
        for holder in holders:
            for key in holder.pod_keys:
                by_pod.setdefault(key, []).append(holder)
    return by_pod
