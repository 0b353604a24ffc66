"""The writer drains a backlog in bursts (one loop wake-up per burst), at the bucket's rate, in order."""

from __future__ import annotations

import asyncio

import pytest

from gpuwm.controller.kube.ratelimit import TokenBucket
from gpuwm.controller.status.writer import WRITE_BURST_SECONDS, StatusWriter
from tests.unit.controller.test_pods_agents import RecordingClient, desired


async def _settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


async def test_a_backlog_goes_in_bursts_never_past_the_tokens() -> None:
    client = RecordingClient()
    now = [0.0]
    bucket = TokenBucket(20.0, clock=lambda: now[0])  # burst 20: full at the start
    writer = StatusWriter(client, bucket, interval_seconds=15, clock=lambda: now[0])  # type: ignore[arg-type]
    writer.existing.update(("gpuworkloadmetrics", "ns", f"w{index}") for index in range(45))  # patches only
    for index in range(45):
        writer.offer(desired(f"w{index}", 1))
    task = asyncio.create_task(writer.run())
    await _settle()
    burst = int(20.0 * WRITE_BURST_SECONDS)
    assert burst == 10
    assert len(client.calls) == 20  # the 20 saved tokens, in two bursts of 10; the frozen clock gives no more
    assert [path.rsplit("/", 2)[1] for _, path in client.calls] == [f"w{index}" for index in range(20)]
    now[0] = 0.45  # 9 tokens, not yet a whole burst's: nothing goes
    await asyncio.sleep(0.01)
    assert len(client.calls) == 20
    now[0] = 0.5  # a burst's tokens: the next burst, in offer order
    await asyncio.sleep(0.6)  # the writer sleeps until the tokens are there (at most a burst, in real time)
    await _settle()
    names = [path.rsplit("/", 2)[1] for _, path in client.calls]
    assert names[20:] == [f"w{index}" for index in range(20, 20 + burst)]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_single_write_goes_at_once() -> None:
    client = RecordingClient()
    now = [0.0]
    bucket = TokenBucket(20.0, clock=lambda: now[0])
    assert bucket.try_acquire(19.5)  # half a token left
    writer = StatusWriter(client, bucket, interval_seconds=15, clock=lambda: now[0])  # type: ignore[arg-type]
    writer.existing.add(("gpuworkloadmetrics", "ns", "a"))
    task = asyncio.create_task(writer.run())
    writer.offer(desired("a", 1))
    now[0] = 0.025  # the one token it needs, not a burst's
    await asyncio.sleep(0.05)
    await _settle()
    assert [method for method, _ in client.calls] == ["PATCH"]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
