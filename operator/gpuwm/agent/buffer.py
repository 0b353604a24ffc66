"""The bounded record buffer behind `/v1/snapshot?since=SEQ`, kept compressed.

Each record (GPU sample, pod stats) is serialised once to JSON; every `block_records` records are
zlib-compressed as one block (level 3: a little larger than 6 for much less of the agent's scarce CPU),
where successive samples of a GPU differ little. A pull decompresses only the blocks after `since` and
splices their JSON into the response.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from pydantic import BaseModel

from gpuwm.model import model_json

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
    """Keeps at most `max_records` records (whole blocks are dropped oldest first)."""

    def __init__(self, max_records: int, block_records: int = 512) -> None:
        self.max_records = max_records
        # the open block is not dropped: keep it a small part of the bound
        self.block_records = max(1, min(block_records, max_records // 4))
        self._blocks: deque[_Block] = deque()
        self._open: list[bytes] = []  # the newest records, not compressed yet
        self._count = 0
        self.latest_seq = 0

    def __len__(self) -> int:
        return self._count

    @property
    def oldest_seq(self) -> int:
        return self._blocks[0].first_seq if self._blocks else self.latest_seq - len(self._open) + 1

    @property
    def compressed_bytes(self) -> int:
        return sum(len(block.data) for block in self._blocks)

    def append(self, records: list[tuple[bytes, BaseModel]]) -> None:
        """Add one poll's records, each (kind, model with consecutive `seq` after `latest_seq`)."""
        for kind, model in records:
            self._open.append(kind + model_json(model))  # model_dump_json's bytes, for less CPU
        self._count += len(records)
        self.latest_seq += len(records)
        if len(self._open) >= self.block_records:
            first_seq = self.latest_seq - len(self._open) + 1
            data = zlib.compress(b"\n".join(self._open), 3)  # level 3: see above
            self._blocks.append(_Block(first_seq, self.latest_seq, data))
            self._open = []
        while self._count > self.max_records and self._blocks:
            dropped = self._blocks.popleft()
            self._count -= dropped.last_seq - dropped.first_seq + 1

    def _lines_after(self, since: int) -> Iterator[tuple[int, list[bytes]]]:
        """(first seq, lines) of each block holding records after `since`, the open one last."""
        for block in self._blocks:
            if block.last_seq > since:
                yield block.first_seq, zlib.decompress(block.data).split(b"\n")
        if self._open:
            yield self.latest_seq - len(self._open) + 1, self._open

    def since(self, since: int, limit: int) -> Records:
        """Records with seq > `since`, at most `limit` of them, oldest first."""
        samples: list[bytes] = []
        pod_stats: list[bytes] = []
        truncated = since + 1 < self.oldest_seq and since < self.latest_seq
        last_seq = since
        more = False
        for first_seq, lines in self._lines_after(since):
            for offset in range(max(0, since + 1 - first_seq), len(lines)):
                if len(samples) + len(pod_stats) >= limit:
                    more = True
                    break
                line = lines[offset]
                (samples if line[:1] == SAMPLE else pod_stats).append(line[1:])
                last_seq = first_seq + offset
            if more:
                break
        if not more:
            last_seq = self.latest_seq
        return Records(samples, pod_stats, last_seq, more, truncated)
