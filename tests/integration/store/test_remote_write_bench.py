"""bench/_remote_write.py: the hand-encoded remote-write protobuf, and a real Prometheus taking it.

bench/api.py loads 200 M samples into Prometheus through this encoder; a wrong byte would show
there only as a rejected request or wrong answers after a long run, so it is checked here small.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bench._remote_write import (
    SeriesBlock,
    encode_labels,
    encode_write_request,
    instant_value,
    remote_write,
    varint,
)
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # type: ignore[import-untyped]

from tests.integration.store.prometheus_fixture import MISSING, PROMETHEUS, running_prometheus


def _write_request_class() -> Any:
    """prometheus.WriteRequest built from its descriptor (the fields of Prometheus' remote.proto)."""
    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="gpuwm_test_remote.proto", package="gpuwm_test", syntax="proto3")
    for name, fields in (
        ("Label", [("name", 1, field.TYPE_STRING, ""), ("value", 2, field.TYPE_STRING, "")]),
        ("Sample", [("value", 1, field.TYPE_DOUBLE, ""), ("timestamp", 2, field.TYPE_INT64, "")]),
        (
            "TimeSeries",
            [("labels", 1, field.TYPE_MESSAGE, ".gpuwm_test.Label"), ("samples", 2, field.TYPE_MESSAGE, ".gpuwm_test.Sample")],
        ),
        ("WriteRequest", [("timeseries", 1, field.TYPE_MESSAGE, ".gpuwm_test.TimeSeries")]),
    ):
        message = proto.message_type.add(name=name)
        for field_name, number, kind, type_name in fields:
            added = message.field.add(
                name=field_name,
                number=number,
                type=kind,
                label=field.LABEL_REPEATED if type_name else field.LABEL_OPTIONAL,
            )
            if type_name:
                added.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("gpuwm_test.WriteRequest"))


def test_varint_matches_protobuf() -> None:
    assert varint(0) == b"\x00"
    assert varint(300) == b"\xac\x02"
    assert varint(1_790_000_000_000)[-1] < 0x80 and len(varint(1_790_000_000_000)) == 6
    with pytest.raises(ValueError, match="non-negative"):
        varint(-1)


def test_write_request_decodes_with_protobuf() -> None:
    labels = [
        encode_labels({"zone": "b", "__name__": "gpuwm_gpu_utilization_percent", "Upper": "x" * 300}),
        encode_labels({"__name__": "gpuwm_workload_pod_info", "pod": "é"}),
    ]
    values = np.array([[1.5, -2.25, 1e-300], [0.0, 100.0, math.pi]])
    timestamps = np.array([1_790_000_000_000, 1_790_000_015_000, 1_790_000_030_000])
    decoded = _write_request_class()()
    decoded.ParseFromString(encode_write_request(labels, values, timestamps))
    assert len(decoded.timeseries) == 2
    first, second = decoded.timeseries
    # __name__ first, then by name (Prometheus' order)
    assert [label.name for label in first.labels] == ["__name__", "Upper", "zone"]
    assert first.labels[1].value == "x" * 300
    assert [(label.name, label.value) for label in second.labels] == [
        ("__name__", "gpuwm_workload_pod_info"),
        ("pod", "é"),
    ]
    assert [(s.value, s.timestamp) for s in first.samples] == list(zip(values[0], timestamps, strict=True))
    assert [s.value for s in second.samples] == list(values[1])


def test_write_request_refuses_what_it_cannot_encode() -> None:
    with pytest.raises(ValueError, match="label sets"):
        encode_write_request([encode_labels({"__name__": "m"})], np.zeros((2, 1)), np.array([1_790_000_000_000]))
    with pytest.raises(ValueError, match="epoch milliseconds"):
        encode_write_request([encode_labels({"__name__": "m"})], np.zeros((1, 1)), np.array([1_790_000_000]))


@pytest.mark.integration
@pytest.mark.skipif(PROMETHEUS is None, reason=MISSING)
def test_prometheus_takes_every_sample_in_order(tmp_path: Path) -> None:
    """Few blocks and many requests: a block's next request must wait for its previous one, or Prometheus
    refuses it as out of order (400) and remote_write raises."""
    pytest.importorskip("cramjam", reason="the bench extra (pip install -e .[bench]) provides snappy")
    series = 5
    ticks = 100
    t0 = 1_790_000_000 - 1_790_000_000 % 3600

    def values(block: int) -> Callable[[np.ndarray], np.ndarray]:
        return lambda k: (np.arange(series)[:, None] * 1000 + block * 100 + k[None, :]).astype(np.float64)

    blocks = [
        SeriesBlock(
            [encode_labels({"__name__": "bench_test_value", "block": str(b), "series": str(i)}) for i in range(series)],
            values(b),
        )
        for b in range(2)
    ]
    with running_prometheus(tmp_path / "tsdb", tmp_path, remote_write=True) as base:
        result = remote_write(f"{base}/api/v1/write", blocks, ticks, t0, 15, ticks_per_request=7, in_flight=4)
        assert result.samples == 2 * series * ticks
        assert result.requests == 2 * math.ceil(ticks / 7)
        end = t0 + 15 * (ticks - 1)
        assert instant_value(base, "count(bench_test_value)", end) == 2 * series
        assert instant_value(base, f"sum(count_over_time(bench_test_value[{ticks * 15}s]))", end) == 2 * series * ticks
        # the value at tick 42 of series 3 in block 1
        assert instant_value(base, 'bench_test_value{block="1", series="3"}', t0 + 15 * 42) == 3142.0
