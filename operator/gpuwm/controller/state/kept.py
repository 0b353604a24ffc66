"""A copy of the engine state in the API server, for a replica in another pod.

The state file sits on the controller pod's own volume (an emptyDir by default), which goes with the
pod: a standby that takes over, or the leader's pod deleted and made again, would start from the CRs'
figures alone. So the leading replica also keeps the state file, compressed, in a Secret of its own
namespace (`--state-secret`, the chart's `<release>-controller-state`) each time it saves it and when
it stops. A replica that starts leading restores that copy when it is newer than its own file, and
then, as after any restart, re-reads the agents from the saved positions: nothing is lost while the
agents still hold those samples.

A Secret holds about 1 MiB: a state that compresses to more (a cluster of some thousand GPUs) is not
kept there, said once in the log; a PersistentVolumeClaim (`controller.persistence.existingClaim`)
keeps any size. A Secret, not a ConfigMap: the state names every GPU pod of the cluster, and a
namespace's viewers may read its ConfigMaps.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from gpuwm.controller.kube import KubeApiError, KubeClient
from gpuwm.controller.state.persistence import write_state

logger = logging.getLogger(__name__)

#: the Secret's key holding the zlib-compressed state file
STATE_KEY = "engine-state.zlib"
#: the Secret's annotation: when the copy was saved (epoch seconds)
SAVED_AT = "gpuwm.io/saved-at"
#: most compressed bytes kept: a Secret's data may hold 1 MiB, and its JSON carries them in base64
MAX_KEPT_BYTES = 900 * 1024
#: a state file larger than this many times MAX_KEPT_BYTES is not even compressed: it cannot fit
MAX_COMPRESSION_RATIO = 30
#: most bytes a kept copy may decompress to (a damaged or foreign Secret must not fill the disk)
MAX_STATE_BYTES = 1 << 30
_BLOCK = 1 << 20


def compress_state(path: Path, limit: int = MAX_KEPT_BYTES) -> bytes | None:
    """The state file zlib-compressed, or None when it would take more than `limit` bytes."""
    if path.stat().st_size > limit * MAX_COMPRESSION_RATIO:
        return None
    packer, pieces, size = zlib.compressobj(6), [], 0
    with path.open("rb") as file:
        for block in iter(lambda: file.read(_BLOCK), b""):
            piece = packer.compress(block)
            size += len(piece)
            if size > limit:
                return None
            pieces.append(piece)
    pieces.append(packer.flush())
    data = b"".join(pieces)
    return data if len(data) <= limit else None


def decompress_state(data: bytes, limit: int = MAX_STATE_BYTES) -> bytes:
    """What `compress_state` compressed; ValueError when it is not that, or larger than `limit`."""
    unpacker = zlib.decompressobj()
    try:
        state = unpacker.decompress(data, limit)
    except zlib.error as error:
        raise ValueError(f"not a compressed state ({error})") from None
    if unpacker.unconsumed_tail or not unpacker.eof:
        raise ValueError(f"the kept state is cut short or larger than {limit} bytes")
    return state


class KeptState:
    """The Secret `name` in `namespace` holding the leader's engine state; uploads and downloads it."""

    def __init__(self, client: KubeClient, namespace: str, name: str, clock: Callable[[], float] = time.time) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name
        self.clock = clock
        self.path = f"/api/v1/namespaces/{namespace}/secrets/{name}"
        self._too_large_said = False
        self._uploading: asyncio.Task[bool] | None = None
        self.uploads = 0

    def keep_in_background(self, state_file: Path) -> None:
        """`upload` in a task of its own, one at a time: while a copy is on its way, a newer save waits for the next."""
        if self._uploading is None or self._uploading.done():
            self._uploading = asyncio.create_task(self.upload(state_file), name="gpuwm kept state")

    async def keep_now(self, state_file: Path, timeout_seconds: float = 10.0) -> None:
        """At a stop: the last save's copy, once a copy still on its way is done."""
        try:
            if self._uploading is not None:
                await asyncio.wait_for(self._uploading, timeout_seconds)
            await asyncio.wait_for(self.upload(state_file), timeout_seconds)
        except TimeoutError:
            logger.warning("the engine state's copy in Secret %s/%s was not written before the stop",
                           self.namespace, self.name)

    async def upload(self, state_file: Path) -> bool:
        """Keep `state_file` in the Secret; False when it is too large or the write failed (logged)."""
        try:
            data = await asyncio.to_thread(compress_state, state_file)
        except OSError as error:
            logger.warning("cannot read the engine state %s to keep it in Secret %s: %s", state_file, self.name, error)
            return False
        if data is None:
            if not self._too_large_said:
                self._too_large_said = True
                logger.warning("the engine state %s compresses to more than a Secret holds (%d KiB): a replica in "
                               "another pod restores from the CRs' figures; give the controller a volume "
                               "(controller.persistence.existingClaim) to keep it", state_file, MAX_KEPT_BYTES // 1024)
            return False
        try:
            await self._write({SAVED_AT: f"{self.clock():.3f}"}, {STATE_KEY: base64.b64encode(data).decode()})
        except KubeApiError as error:
            logger.warning("cannot keep the engine state in Secret %s/%s (%s); the controller's Role grants it",
                           self.namespace, self.name, error)
            return False
        self.uploads += 1
        return True

    async def _write(self, annotations: dict[str, str], data: dict[str, str]) -> None:
        """Patch the Secret's copy in place; make the Secret where it does not exist yet."""
        try:
            await self.client.merge_patch(self.path, {"metadata": {"annotations": annotations}, "data": data})
        except KubeApiError as error:
            if error.status != 404:
                raise
            await self.client.create(f"/api/v1/namespaces/{self.namespace}/secrets", {
                "apiVersion": "v1", "kind": "Secret", "type": "Opaque", "data": data,
                "metadata": {"name": self.name, "annotations": annotations,
                             "labels": {"app.kubernetes.io/managed-by": "gpuwm"}},
            })

    async def download_newer(self, state_file: Path) -> bool:
        """Write the kept copy over `state_file` when it was saved after that file; True when it did."""
        try:
            secret = await self.client.get(self.path)
        except KubeApiError as error:
            logger.warning("cannot read the kept engine state in Secret %s/%s (%s)", self.namespace, self.name, error)
            return False
        if secret is None or STATE_KEY not in (secret.get("data") or {}):
            return False
        try:
            saved_at = float(((secret.get("metadata") or {}).get("annotations") or {}).get(SAVED_AT, "0"))
            if state_file.exists() and state_file.stat().st_mtime >= saved_at:
                return False  # this pod's own file is as new: a restart of the same container
            state = decompress_state(base64.b64decode(secret["data"][STATE_KEY]))
        except (ValueError, OSError) as error:
            logger.warning("the kept engine state in Secret %s/%s is unusable (%s)", self.namespace, self.name, error)
            return False
        await asyncio.to_thread(write_state, state_file, state)
        os.utime(state_file, (saved_at, saved_at))
        logger.info("engine state from Secret %s/%s, saved %.0f s ago (%d bytes)", self.namespace, self.name,
                    self.clock() - saved_at, len(state))
        return True
