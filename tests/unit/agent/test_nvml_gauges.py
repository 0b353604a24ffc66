"""`NvmlSampler._gauges`: temperature, clocks, power limit and the 20 ms PCIe reading, taken at most every
`GAUGES_EVERY_SECONDS`, kept between."""

from __future__ import annotations

from typing import Any

import pynvml
import pytest

from gpuwm.agent.nvml import GAUGES_EVERY_SECONDS, NvmlSampler
from gpuwm.agent.readings import Device


class FakeDriver:
    """`nvmlDeviceGetPcieThroughput` (KB/s by direction, or an NVML error), with a call count."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.kbs: dict[int, int] = {pynvml.NVML_PCIE_UTIL_RX_BYTES: 7, pynvml.NVML_PCIE_UTIL_TX_BYTES: 9}
        self.error: int | None = None
        self.calls = 0
        monkeypatch.setattr(pynvml, "nvmlDeviceGetPcieThroughput", self.throughput)
        self.temperature = 50
        monkeypatch.setattr(pynvml, "nvmlDeviceGetTemperature", lambda handle, sensor: self.temperature)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetEnforcedPowerLimit", lambda handle: 700_000)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetClockInfo", lambda handle, kind: 1980)

    def throughput(self, handle: Any, counter: int) -> int:
        self.calls += 1
        if self.error is not None:
            raise pynvml.NVMLError(self.error)
        return self.kbs[counter]


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    return FakeDriver(monkeypatch)


def _device() -> Device:
    return Device(handle=object(), uuid="GPU-1", index=0, model="m")


def _pcie(sampler: NvmlSampler, device: Device) -> tuple[float | None, float | None]:
    gauges = sampler._gauges(device)
    return gauges["pcie_rx_bytes_per_second"], gauges["pcie_tx_bytes_per_second"]


def test_read_on_the_first_poll_then_kept_until_the_period_passes(driver: FakeDriver) -> None:
    sampler, device = NvmlSampler("n", 1.0), _device()
    assert _pcie(sampler, device) == (7 * 1024.0, 9 * 1024.0)
    driver.kbs[pynvml.NVML_PCIE_UTIL_RX_BYTES], driver.temperature = 70, 60
    for _ in range(4):  # polls within the period: the reading kept, no 20 ms call
        device.gauges_at -= 1.0  # a second passes
        assert _pcie(sampler, device) == (7 * 1024.0, 9 * 1024.0)
        assert sampler._gauges(device)["temperature_celsius"] == 50.0
    assert driver.calls == 2
    device.gauges_at -= GAUGES_EVERY_SECONDS - 4.0
    assert _pcie(sampler, device) == (70 * 1024.0, 9 * 1024.0)
    assert sampler._gauges(device) == {
        "temperature_celsius": 60.0, "power_limit_watts": 700.0, "sm_clock_mhz": 1980.0, "memory_clock_mhz": 1980.0,
        "pcie_rx_bytes_per_second": 70 * 1024.0, "pcie_tx_bytes_per_second": 9 * 1024.0}
    assert driver.calls == 4


def test_each_gpu_keeps_its_own_reading(driver: FakeDriver) -> None:
    sampler, first, second = NvmlSampler("n", 1.0), _device(), _device()
    _pcie(sampler, first)
    driver.kbs[pynvml.NVML_PCIE_UTIL_TX_BYTES] = 90
    assert _pcie(sampler, second) == (7 * 1024.0, 90 * 1024.0)  # not the first GPU's kept figures
    assert _pcie(sampler, first) == (7 * 1024.0, 9 * 1024.0)


def test_unsupported_gives_none_and_is_not_asked_every_poll(driver: FakeDriver) -> None:
    driver.error = pynvml.NVML_ERROR_NOT_SUPPORTED
    sampler, device = NvmlSampler("n", 1.0), _device()
    assert _pcie(sampler, device) == (None, None)
    device.gauges_at -= 1.0
    assert _pcie(sampler, device) == (None, None)
    assert driver.calls == 2


def test_a_lost_gpu_raises_for_poll_to_mark_it_unhealthy(driver: FakeDriver) -> None:
    driver.error = pynvml.NVML_ERROR_GPU_IS_LOST
    with pytest.raises(pynvml.NVMLError) as raised:
        _pcie(NvmlSampler("n", 1.0), _device())
    assert raised.value.value == pynvml.NVML_ERROR_GPU_IS_LOST
