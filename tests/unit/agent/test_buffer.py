"""The compressed record buffer behind /v1/snapshot: since, limits, bounds, kinds."""

from __future__ import annotations

import json

import pytest

from gpuwm.agent.buffer import POD_STATS, SAMPLE, RecordBuffer
from gpuwm.model import GpuSample, PodStatsSample, ProcessSample
from gpuwm.model.jsonfast import model_json


def _poll(buffer: RecordBuffer, gpus: int, with_stats: bool = False) -> None:
    seq = buffer.latest_seq
    records: list[tuple[bytes, GpuSample | PodStatsSample]] = [
        (SAMPLE, GpuSample(t=float(seq + i), node="n", uuid=f"GPU-{i}", seq=seq + i, sm_percent=float(i)))
        for i in range(1, gpus + 1)
    ]
    if with_stats:
        records.append((POD_STATS, PodStatsSample(t=1.0, node="n", namespace="ns", pod="p", pod_uid="u", seq=seq + gpus + 1)))
    buffer.append(records)  # type: ignore[arg-type]


def _seqs(lines: list[bytes]) -> list[int]:
    return [json.loads(line)["seq"] for line in lines]


@pytest.mark.parametrize("block_records", [3, 5, 512])
def test_since_returns_exactly_the_later_records(block_records: int) -> None:
    buffer = RecordBuffer(max_records=1000, block_records=block_records)
    for _ in range(5):
        _poll(buffer, gpus=4, with_stats=True)  # 5 records per poll
    assert buffer.latest_seq == 25
    everything = buffer.since(0, limit=1000)
    assert _seqs(everything.samples) == [s for s in range(1, 26) if s % 5 != 0]
    assert _seqs(everything.pod_stats) == [5, 10, 15, 20, 25]
    middle = buffer.since(12, limit=1000)  # inside a block
    assert _seqs(middle.samples) == [13, 14, 16, 17, 18, 19, 21, 22, 23, 24]
    assert middle.last_seq == 25 and not middle.more and not middle.truncated
    assert buffer.since(25, limit=1000).samples == []
    assert all(set(json.loads(line)) == set(GpuSample.model_fields) for line in everything.samples)


@pytest.mark.parametrize("block_records", [4, 512])
def test_limit_pages_through(block_records: int) -> None:
    buffer = RecordBuffer(max_records=1000, block_records=block_records)
    for _ in range(3):
        _poll(buffer, gpus=4)
    page = buffer.since(0, limit=5)
    assert _seqs(page.samples) == [1, 2, 3, 4, 5]
    assert page.more and page.last_seq == 5
    rest = buffer.since(page.last_seq, limit=5)
    assert _seqs(rest.samples) == [6, 7, 8, 9, 10] and rest.more
    last = buffer.since(rest.last_seq, limit=5)
    assert _seqs(last.samples) == [11, 12] and not last.more and last.last_seq == 12


def test_bounded_and_truncation_reported() -> None:
    buffer = RecordBuffer(max_records=16, block_records=4)
    for _ in range(6):
        _poll(buffer, gpus=4)
    assert len(buffer) == 16
    assert buffer.oldest_seq == 9  # whole blocks dropped, oldest first
    late = buffer.since(3, limit=100)
    assert late.truncated
    assert _seqs(late.samples) == list(range(9, 25))
    assert not buffer.since(8, limit=100).truncated


def test_compressed_blocks_are_small() -> None:
    buffer = RecordBuffer(max_records=100_000)
    for _ in range(128):
        _poll(buffer, gpus=8)
    assert len(buffer) == 1024 and buffer.compressed_bytes > 0
    assert buffer.compressed_bytes / 1024 < 100  # bytes per record, against ~400 as JSON


_ODD_FLOATS = [0.0, 1e-7, 1 / 3, 0.1 + 0.2, 400.123, 1.5e9, 12345678901234.5, 1e16, 1e22, 2.0**53 + 2]


@pytest.mark.parametrize("value", _ODD_FLOATS)
def test_the_buffers_json_is_model_dump_json(value: float) -> None:
    """The buffer's fast JSON must stay byte-identical to pydantic's (the snapshot format)."""
    samples = [
        GpuSample(
            t=1_700_000_000.0 + value, node="node-ü", uuid="GPU-1", seq=7, index=3, model='H100 "SXM"\n\\x',
            sm_percent=min(100.0, value), memory_used_bytes=value, memory_total_bytes=8.5e10, power_watts=value,
            energy_joules=value, temperature_celsius=-value, pcie_rx_bytes_per_second=value,
            processes=[ProcessSample(pid=42, pod_uid="u-1", container="main", sm_percent=min(100.0, value),
                                     memory_used_bytes=value), ProcessSample(pid=43)],
        ),
        GpuSample(t=value, node="n", uuid="MIG-1", parent_uuid="GPU-1", mig_profile="1g.10gb", device_units=1 / 7,
                  processes=[]),
        GpuSample(t=value, node="n", uuid="GPU-2", healthy=False, error="NVMLError_GpuIsLost: GPU is lost \u2014 \"x\""),
    ]
    for sample in samples:
        assert model_json(sample) == sample.model_dump_json().encode()
    stats = PodStatsSample(t=value, node="n", namespace="ns", pod="p", pod_uid="u", seq=1, cpu_usage_cores=value,
                           memory_used_bytes=value)
    assert model_json(stats) == stats.model_dump_json().encode()


def test_the_buffers_json_refuses_what_it_cannot_write() -> None:
    class Odd(PodStatsSample):
        pass

    odd = Odd(t=1.0, node="n", namespace="ns", pod="p", pod_uid="u")
    object.__setattr__(odd, "__dict__", {**odd.__dict__, "extra": object()})
    with pytest.raises(TypeError):
        model_json(odd)
