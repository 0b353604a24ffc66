"""The bounded record buffer behind `/v1/snapshot?since=SEQ`, kept compressed.

Each poll's records (GPU samples, pod stats) are serialised once to JSON and zlib-compressed as
one block: a sample with four processes is ~1.1 KB as JSON and ~3 KB as a Python object, but ~100
bytes in a compressed block, so the default 100,000 records fit in a few MiB instead of hundreds.
A pull decompresses only the blocks after `since` and splices their JSON into the response.
"""

from __future__ import annotations

import zlib
from collections import deque
from dataclasses import dataclass

from pydantic import BaseModel

SAMPLE = b"s"
POD_STATS = b"p"


@dataclass(frozen=True, slots=True)
class _Block:
    first_seq: int
    last_seq: int
    data: bytes  # zlib of b"\n".join(kind + json) for seq first..last


@dataclass(frozen=True)
class Records:
    """JSON of the records after some seq, split by kind; `more` when a limit cut the list."""

    samples: list[bytes]
    pod_stats: list[bytes]
    last_seq: int
    more: bool
    truncated: bool


class RecordBuffer:
    """Keeps at most `max_records` records (whole poll blocks are dropped oldest first)."""

    def __init__(self, max_records: int, compression_level: int = 1) -> None:
        self.max_records = max_records
        self.compression_level = compression_level
        self._blocks: deque[_Block] = deque()
        self._count = 0
        self.latest_seq = 0

    def __len__(self) -> int:
        return self._count

    @property
    def oldest_seq(self) -> int:
        return self._blocks[0].first_seq if self._blocks else self.latest_seq + 1

    @property
    def compressed_bytes(self) -> int:
        return sum(len(block.data) for block in self._blocks)

    def append(self, records: list[tuple[bytes, BaseModel]]) -> None:
        """Add one poll's records, each (kind, model with consecutive `seq` after `latest_seq`)."""
        if not records:
            return
        first_seq = self.latest_seq + 1
        lines = [kind + model.model_dump_json().encode() for kind, model in records]
        block = _Block(first_seq, first_seq + len(lines) - 1, zlib.compress(b"\n".join(lines), self.compression_level))
        self._blocks.append(block)
        self._count += len(lines)
        self.latest_seq = block.last_seq
        while self._count > self.max_records and len(self._blocks) > 1:
            dropped = self._blocks.popleft()
            self._count -= dropped.last_seq - dropped.first_seq + 1

    def since(self, since: int, limit: int) -> Records:
        """Records with seq > `since`, at most `limit` of them, oldest first."""
        samples: list[bytes] = []
        pod_stats: list[bytes] = []
        truncated = since + 1 < self.oldest_seq and since < self.latest_seq
        last_seq = since
        more = False
        for block in self._blocks:
            if block.last_seq <= since:
                continue
            lines = zlib.decompress(block.data).split(b"\n")
            start = max(0, since + 1 - block.first_seq)
            for offset in range(start, len(lines)):
                if len(samples) + len(pod_stats) >= limit:
                    more = True
                    break
                line = lines[offset]
                (samples if line[:1] == SAMPLE else pod_stats).append(line[1:])
                last_seq = block.first_seq + offset
            if more:
                break
        if not more:
            last_seq = self.latest_seq
        return Records(samples, pod_stats, last_seq, more, truncated)
