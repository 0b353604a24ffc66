"""PID -> pod UID and container ID from `/proc/PID/cgroup` (the attribution fallback, and per process).

Both cgroup v1 (`11:memory:/kubepods/burstable/pod<uid>/<id>`) and v2 (`0::/kubepods.slice/...`)
lines are read, with the cgroupfs and the systemd driver's path shapes
(`kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope`).
The host's /proc is mounted into the agent at `proc_root`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_CONTAINER_ID = re.compile(r"^(?:[a-z-]+-)?([0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True)
class PodRef:
    """Where a process runs: its pod's UID and, when the path shows it, its container ID."""

    pod_uid: str
    container_id: str | None = None


def parse_cgroup(text: str) -> PodRef | None:
    """The pod of a `/proc/PID/cgroup` text, or None for a process outside any pod."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        path = parts[2]
        match = _POD_UID.search(path)
        if match is None:
            continue
        uid = match.group(1).replace("_", "-")
        leaf = path.rstrip("/").rsplit("/", 1)[-1]
        container = _CONTAINER_ID.match(leaf)
        return PodRef(uid, container.group(1) if container else None)
    return None


class CgroupReader:
    """Looks up processes' pods under `proc_root`, caching per PID until the PID leaves the GPU."""

    def __init__(self, proc_root: str) -> None:
        self.proc_root = Path(proc_root)
        self._cache: dict[int, PodRef | None] = {}

    def pod_of(self, pid: int) -> PodRef | None:
        if pid in self._cache:
            return self._cache[pid]
        try:
            text = (self.proc_root / str(pid) / "cgroup").read_text()
        except OSError as error:
            # the process may have exited, or the host /proc is not mounted: not cached, tried again
            log.debug("cgroup of PID %d unreadable under %s: %s", pid, self.proc_root, error)
            return None
        reference = parse_cgroup(text)
        self._cache[pid] = reference
        return reference

    def retain(self, pids: set[int]) -> None:
        """Forget PIDs no longer on any GPU (PIDs are reused)."""
        self._cache = {pid: reference for pid, reference in self._cache.items() if pid in pids}
