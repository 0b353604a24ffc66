"""Load a real Prometheus through its remote-write receiver, fast enough for 200 M samples on 2 cores.

`promtool tsdb create-blocks-from openmetrics` parses text (an 8.5 GB file for 52 M samples) and
did not finish 24 h of 1,000 workloads in 15 minutes; the remote-write receiver
(`--web.enable-remote-write-receiver`) takes snappy-compressed protobuf, which numpy can write
without a protobuf library because every sample has the same size:

    WriteRequest { repeated TimeSeries timeseries = 1; }
    TimeSeries   { repeated Label labels = 1; repeated Sample samples = 2; }
    Label        { string name = 1; string value = 2; }
    Sample       { double value = 1; int64 timestamp = 2; }   (timestamp in ms)

Requests go out in time order (every series for one block of timestamps, then the next), so
the head never sees a sample older than its append window and no out-of-order window is needed.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

log = logging.getLogger(__name__)

HEADERS = {
    "Content-Encoding": "snappy",
    "Content-Type": "application/x-protobuf",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}
_TIMESTAMP_BYTES = 6  # varint of a millisecond timestamp in [2^35, 2^42): years 1971-2109
_SAMPLE_BYTES = 2 + 1 + 8 + 1 + _TIMESTAMP_BYTES  # field tag, length, value tag, double, ts tag, varint


def varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative integer."""
    if value < 0:
        raise ValueError(f"varint of {value}: only non-negative values are encoded here")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return bytes([field << 3 | 2]) + varint(len(payload)) + payload


def encode_labels(labels: dict[str, str]) -> bytes:
    """A series' Label fields, sorted by name with __name__ first (what Prometheus expects)."""
    ordered = sorted(labels.items(), key=lambda item: (item[0] != "__name__", item[0]))
    return b"".join(
        _length_delimited(1, _length_delimited(1, name.encode()) + _length_delimited(2, value.encode()))
        for name, value in ordered
    )


def _timestamp_varints(timestamps_ms: np.ndarray) -> np.ndarray:
    """[T, 6] uint8: each timestamp's 6-byte varint."""
    if timestamps_ms.min() < 2**35 or timestamps_ms.max() >= 2**42:
        raise ValueError(
            "timestamps must be epoch milliseconds between 1971 and 2109 (6-byte varints); "
            f"got {int(timestamps_ms.min())}..{int(timestamps_ms.max())}"
        )
    shifts = np.arange(_TIMESTAMP_BYTES, dtype=np.int64) * 7
    groups = (timestamps_ms.astype(np.int64)[:, None] >> shifts) & 0x7F
    groups[:, :-1] |= 0x80
    return groups.astype(np.uint8)


def encode_write_request(series_labels: Sequence[bytes], values: np.ndarray, timestamps_ms: np.ndarray) -> bytes:
    """One WriteRequest: series i has labels `series_labels[i]` and samples `values[i]` at `timestamps_ms`.

    Every Sample message is 18 bytes, so the samples of all series are one numpy array.
    """
    count, ticks = values.shape
    if count != len(series_labels) or ticks != len(timestamps_ms):
        raise ValueError(
            f"values are {count} x {ticks} but there are {len(series_labels)} label sets and "
            f"{len(timestamps_ms)} timestamps"
        )
    samples = np.empty((count, ticks, _SAMPLE_BYTES), dtype=np.uint8)
    samples[:, :, 0] = 2 << 3 | 2  # TimeSeries.samples, length-delimited
    samples[:, :, 1] = _SAMPLE_BYTES - 2
    samples[:, :, 2] = 1 << 3 | 1  # Sample.value, 64-bit
    samples[:, :, 3:11] = np.ascontiguousarray(values, dtype="<f8").view(np.uint8).reshape(count, ticks, 8)
    samples[:, :, 11] = 2 << 3 | 0  # Sample.timestamp, varint
    samples[:, :, 12:] = _timestamp_varints(timestamps_ms)[None]
    sample_bytes = ticks * _SAMPLE_BYTES
    parts: list[bytes | memoryview] = []
    for index, labels in enumerate(series_labels):
        parts.append(b"\x0a" + varint(len(labels) + sample_bytes))
        parts.append(labels)
        parts.append(memoryview(samples[index]).cast("B"))
    return b"".join(parts)


@dataclass(frozen=True)
class SeriesBlock:
    """Consecutive series that go out together: their label sets and how to compute their values."""

    labels: Sequence[bytes]
    values: Callable[[np.ndarray], np.ndarray]  # tick indices [T] -> values [len(labels), T]


@dataclass
class LoadResult:
    samples: int
    requests: int
    seconds: float
    raw_bytes: int
    compressed_bytes: int


def _requests(
    blocks: Sequence[SeriesBlock], ticks: int, t0_seconds: int, step_seconds: int, ticks_per_request: int
) -> Iterator[tuple[int, int, bytes]]:
    """(block index, sample count, protobuf) in time order: every block for one span of ticks, then the next."""
    for first in range(0, ticks, ticks_per_request):
        indices = np.arange(first, min(ticks, first + ticks_per_request))
        timestamps_ms = (t0_seconds + step_seconds * indices).astype(np.int64) * 1000
        for number, block in enumerate(blocks):
            values = block.values(indices)
            yield number, values.size, encode_write_request(block.labels, values, timestamps_ms)


def remote_write(
    url: str,
    blocks: Sequence[SeriesBlock],
    ticks: int,
    t0_seconds: int,
    step_seconds: int,
    ticks_per_request: int = 40,
    in_flight: int = 4,
    progress_seconds: float = 60.0,
) -> LoadResult:
    """Send every block's samples at t0 + step * [0, ticks) to `url` (.../api/v1/write), `in_flight` at a time.

    A block's next request waits for its previous one, so no series ever receives samples out of
    order, however few blocks there are; the span of ticks in flight stays far inside the head's
    one-hour append window.
    """
    import cramjam

    if ticks_per_request * step_seconds * 2 > 3600:
        raise ValueError(
            f"{ticks_per_request} ticks of {step_seconds} s per request: keep two requests within Prometheus' "
            "1 h append window (fewer ticks per request)"
        )
    started = time.monotonic()
    last_report = started
    samples = requests = raw_bytes = compressed_bytes = 0
    total = sum(len(block.labels) for block in blocks) * ticks
    pending: dict[int, concurrent.futures.Future[None]] = {}  # block -> its latest request

    with httpx.Client(timeout=600, limits=httpx.Limits(max_connections=in_flight)) as client:

        def send(body: bytes) -> None:
            response = client.post(url, content=body, headers=HEADERS)
            if response.status_code // 100 != 2:
                raise RuntimeError(
                    f"Prometheus remote write at {url} answered {response.status_code}: {response.text[:500]} "
                    "(is it started with --web.enable-remote-write-receiver, and the data in time order?)"
                )

        with concurrent.futures.ThreadPoolExecutor(max_workers=in_flight) as pool:
            for number, count, body in _requests(blocks, ticks, t0_seconds, step_seconds, ticks_per_request):
                compressed = cramjam.snappy.compress_raw(body)
                raw_bytes += len(body)
                compressed_bytes += len(compressed)
                previous = pending.get(number)
                if previous is not None:
                    previous.result()
                while sum(1 for future in pending.values() if not future.done()) >= in_flight:
                    concurrent.futures.wait(
                        [future for future in pending.values() if not future.done()],
                        return_when=concurrent.futures.FIRST_COMPLETED,
                    )
                for future in pending.values():
                    if future.done():
                        future.result()  # raise a failed request's error now
                pending[number] = pool.submit(send, bytes(compressed))
                samples += count
                requests += 1
                now = time.monotonic()
                if now - last_report >= progress_seconds:
                    last_report = now
                    rate = samples / (now - started)
                    print(
                        f"    remote write: {samples / 1e6:.0f}/{total / 1e6:.0f} M samples, {rate / 1e6:.2f} M/s, "
                        f"eta {math.ceil((total - samples) / rate)} s",
                        flush=True,
                    )
            for future in pending.values():
                future.result()
    return LoadResult(samples, requests, time.monotonic() - started, raw_bytes, compressed_bytes)


# -- watching the Prometheus it loads --------------------------------------------------------------


def scrape(base: str) -> dict[str, float]:
    """Prometheus' own /metrics, summed over label sets per metric name."""
    response = httpx.get(f"{base}/metrics", timeout=60)
    response.raise_for_status()
    totals: dict[str, float] = {}
    for line in response.text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_and_labels, _, value = line.rpartition(" ")
        name = name_and_labels.split("{", 1)[0]
        totals[name] = totals.get(name, 0.0) + float(value)
    return totals


def instant_value(base: str, query: str, at: float, timeout_seconds: float = 3600) -> float | None:
    """The single value of an instant PromQL query at `at`, or None when it has no result."""
    response = httpx.get(
        f"{base}/api/v1/query", params={"query": query, "time": repr(at)}, timeout=timeout_seconds
    )
    if response.status_code != 200:
        raise RuntimeError(f"Prometheus at {base} failed {query!r}: {response.status_code} {response.text[:500]}")
    result = response.json()["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def wait_settled(base: str, quiet_seconds: float = 90, limit_seconds: float = 1800) -> dict[str, float]:
    """Wait until the head spans at most 3 h and no compaction ran for `quiet_seconds` (TSDB at rest).

    Prometheus compacts the head into 2 h blocks and merges blocks in the background; a query
    measured while that runs would be paying for it. Returns the last scrape.
    """
    started = time.monotonic()
    last_change = started
    previous: tuple[float, float] | None = None
    while True:
        metrics = scrape(base)
        state = (metrics.get("prometheus_tsdb_compactions_total", 0.0), metrics.get("prometheus_tsdb_blocks_loaded", 0.0))
        head_span = metrics.get("prometheus_tsdb_head_max_time", 0.0) - metrics.get("prometheus_tsdb_head_min_time", 0.0)
        now = time.monotonic()
        if state != previous:
            previous = state
            last_change = now
        if head_span <= 3 * 3600 * 1000 and now - last_change >= quiet_seconds:
            return metrics
        if now - started > limit_seconds:
            log.warning("Prometheus still compacting after %.0f s; measuring anyway", limit_seconds)
            return metrics
        time.sleep(5)


def process_memory(pid: int) -> tuple[int, int]:
    """(resident, peak resident) bytes of a Linux process, from /proc; (0, 0) where unavailable."""
    try:
        text = Path(f"/proc/{pid}/status").read_text(encoding="ascii")
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    except OSError:
        return 0, 0
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024
