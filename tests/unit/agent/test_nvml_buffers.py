"""The driver's buffered and cumulative figures read every `buffer_read_seconds`, split into the polls since.

A stub driver (pynvml's functions replaced, a fake clock) counts the calls: the expensive ones
(`nvmlDeviceGetSamples` for SM activity, the energy counter, per-process utilisation) run once per
read, yet every poll still gets the utilisation of its own second, from the samples' timestamps;
the instant utilisation rates (memory activity, and SM where no sample covers a poll) every poll;
the energy counter once a minute and on a change, carried forward by power in between.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from gpuwm.agent import nvml
from gpuwm.agent.nvml import NvmlSampler
from gpuwm.agent.polls import carry_energy, interval_means, spread_energy
from gpuwm.agent.readings import Device, Reading

SAMPLE_PERIOD_US = 166_667
POWER_MW = 300_000


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now


class Driver:
    """One GPU: SM % by the sample's second (`busy_seconds`: 100 %, else 0), power constant, energy its integral."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, clock: Clock) -> None:
        self.clock = clock
        self.busy_seconds: set[int] = set()
        self.running: list[tuple[int, int | None]] = [(10, 1 << 20)]
        self.per_process: dict[int, float] = {10: 40.0}
        self.samples_found = True
        self.energy_offset_mj = 0.0
        self.calls: dict[str, int] = {"samples": 0, "energy": 0, "process_utilization": 0, "rates": 0}
        monkeypatch.setattr(nvml, "time", clock)
        monkeypatch.setattr(nvml, "_running_processes", lambda handle: list(self.running))
        instant = {
            "nvmlDeviceGetMemoryInfo": lambda handle: SimpleNamespace(used=1.0, total=2.0),
            "nvmlDeviceGetTemperature": lambda handle, sensor: 50,
            "nvmlDeviceGetPowerUsage": lambda handle: POWER_MW,
            "nvmlDeviceGetEnforcedPowerLimit": lambda handle: 700_000,
            "nvmlDeviceGetClockInfo": lambda handle, kind: 1980,
            "nvmlDeviceGetPcieThroughput": lambda handle, counter: 1,
            "nvmlDeviceGetCount": lambda: 1,
            "nvmlDeviceGetTotalEnergyConsumption": self.energy,
            "nvmlDeviceGetUtilizationRates": self.rates,
            "nvmlDeviceGetProcessUtilization": self.process_utilization,
            "nvmlDeviceGetSamples": self.samples,
        }
        for name, function in instant.items():
            monkeypatch.setattr(pynvml, name, function)

    def samples(self, handle: Any, sampling_type: int, last_seen_us: int) -> tuple[int, list[Any]]:
        self.calls["samples"] += 1
        if not self.samples_found:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        now_us = int(self.clock.now * 1e6)
        found = []
        for k in range(last_seen_us // SAMPLE_PERIOD_US + 1, now_us // SAMPLE_PERIOD_US + 1):
            stamp = k * SAMPLE_PERIOD_US
            busy = sampling_type == pynvml.NVML_GPU_UTILIZATION_SAMPLES and int((stamp - 1) // 1_000_000) in self.busy_seconds
            found.append(SimpleNamespace(timeStamp=stamp, sampleValue=SimpleNamespace(uiVal=100 if busy else 0)))
        return 1, found

    def energy(self, handle: Any) -> int:
        """The counter: the power's integral, plus `energy_offset_mj` (what the power readings missed)."""
        self.calls["energy"] += 1
        return int(POWER_MW * self.clock.now + self.energy_offset_mj)

    def rates(self, handle: Any) -> Any:
        """SM 7 %, memory 8 % at t=1000, each one more a second later: each poll's own figures are told apart."""
        self.calls["rates"] += 1
        step = int(self.clock.now - 1000.0)
        return SimpleNamespace(gpu=7 + step, memory=8 + step)

    def process_utilization(self, handle: Any, last_seen_us: int) -> list[Any]:
        self.calls["process_utilization"] += 1
        if not self.per_process:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return [SimpleNamespace(pid=pid, timeStamp=int(self.clock.now * 1e6), smUtil=sm)
                for pid, sm in self.per_process.items()]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch, clock: Clock) -> Driver:
    return Driver(monkeypatch, clock)


def _sampler(clock: Clock, buffer_read_seconds: float = 5.0) -> NvmlSampler:
    sampler = NvmlSampler("n", 1.0, rediscover_seconds=1e9, buffer_read_seconds=buffer_read_seconds)
    start_us = int((clock.now - 1.0) * 1e6)
    sampler.devices = [Device(object(), "GPU-1", 0, "m", util_cursor_us=start_us,
                              process_cursor_us=start_us)]
    sampler._device_set = frozenset({"GPU-1"})
    sampler._count, sampler._discovered_at = 1, clock.now
    return sampler


def _polls(sampler: NvmlSampler, clock: Clock, count: int, **options: Any) -> list[list[Reading]]:
    """`count` polls a second apart (the first now): the readings each handed over."""
    handed = []
    for number in range(count):
        if number:
            clock.now += 1.0
        handed.append(sampler.poll(**options).samples)
    return handed


def test_buffers_read_every_period_and_each_poll_keeps_its_own_second(driver: Driver, clock: Clock) -> None:
    driver.busy_seconds = {1003, 1007}  # busy in (1003, 1004] and (1007, 1008]: one poll each
    sampler = _sampler(clock)
    handed = _polls(sampler, clock, 11)
    # the first poll leaves at once; then every 5 polls, each with all the polls since
    assert [len(readings) for readings in handed] == [1, 0, 0, 0, 0, 5, 0, 0, 0, 0, 5]
    readings = [reading.fields for batch in handed for reading in batch]
    assert [fields["t"] for fields in readings] == [1000.0 + second for second in range(11)]
    assert {fields["t"]: fields["sm_percent"] for fields in readings if fields["sm_percent"]} == {1004.0: 100.0, 1008.0: 100.0}
    assert all(fields["sm_percent"] == 0.0 for fields in readings if fields["t"] not in (1004.0, 1008.0))
    # the energy counter, read once in the minute, still steps with each poll (carried forward by power)
    assert [fields["energy_joules"] for fields in readings] == pytest.approx([POWER_MW * f["t"] / 1000 for f in readings])
    # SM samples once per read, the energy counter once a minute; memory activity is each poll's instant rate
    assert driver.calls == {"samples": 3, "energy": 1, "process_utilization": 0, "rates": 11}
    assert [fields["memory_activity_percent"] for fields in readings] == [8.0 + second for second in range(11)]
    # a sole holder (here: none named) gets no per-process read: its processes carry no SM figure
    assert [(p.pid, p.sm_percent) for p in handed[5][0].processes or []] == [(10, None)]


def test_the_energy_counter_is_read_once_a_minute_and_sets_right_what_power_carried(driver: Driver, clock: Clock) -> None:
    """Between the counter's readings the polls carry it forward by power; a reading above that is spread over
    the polls since, one below it (the power ran ahead) holds them until the counter passes: every value handed
    over follows the one before, and at each reading the value is the counter's own."""
    sampler = _sampler(clock)
    handed = [reading.fields for reading in sampler.poll().samples]

    def until(t: float) -> None:
        while clock.now < t:
            clock.now += 1.0
            handed.extend(reading.fields for reading in sampler.poll().samples)

    until(1055.0)
    assert driver.calls["energy"] == 1  # at t=1000; the next is due with the read at 1060
    driver.energy_offset_mj = 900_000.0  # the counter grew 900 J more than the power readings say
    until(1060.0)
    assert driver.calls["energy"] == 2 and handed[-1]["t"] == 1060.0
    assert handed[-1]["energy_joules"] == pytest.approx((POWER_MW * 1060.0 + 900_000.0) / 1000)
    driver.energy_offset_mj = -1_200_000.0  # and now 2,100 J less: the power ran ahead of the counter
    until(1120.0)
    assert driver.calls["energy"] == 3 and handed[-1]["t"] == 1120.0
    held = [fields["energy_joules"] for fields in handed if 1115.0 < fields["t"] <= 1120.0]
    assert held == pytest.approx([(POWER_MW * 1115.0 + 900_000.0) / 1000] * 5)  # held where it was, not back
    joules = [fields["energy_joules"] for fields in handed]
    assert [fields["t"] for fields in handed] == [1000.0 + second for second in range(121)]
    assert all(later >= earlier for earlier, later in itertools.pairwise(joules))
    # the counter passes the held value within the next minute: the next reading is the counter's own again
    until(1180.0)
    assert driver.calls["energy"] == 4
    assert handed[-1]["energy_joules"] == pytest.approx((POWER_MW * 1180.0 - 1_200_000.0) / 1000)


def test_a_change_of_holders_reads_at_once_and_a_shared_device_reads_per_process_every_poll(
    driver: Driver, clock: Clock
) -> None:
    sampler = _sampler(clock)
    pods: frozenset[str] = frozenset({"a"})
    handed = _polls(sampler, clock, 3, holders=lambda device, pids: pods)
    assert [len(readings) for readings in handed] == [1, 0, 0]
    assert driver.calls["process_utilization"] == 0
    pods = frozenset({"a", "b"})
    clock.now += 1.0
    assert [r.fields["t"] for r in sampler.poll(holders=lambda device, pids: pods).samples] == [1001.0, 1002.0, 1003.0]
    assert driver.calls["energy"] == 2  # the counter settles what the holders before used
    clock.now += 1.0
    assert sampler.poll(holders=lambda device, pids: pods).samples == []
    assert driver.calls["process_utilization"] == 2  # each poll of the shared device
    clock.now += 1.0
    (reading, *_) = sampler.poll(holders=lambda device, pids: pods, read_buffers=True).samples
    assert [(p.pid, p.sm_percent) for p in reading.processes or []] == [(10, 40.0)]


def test_processes_coming_or_going_read_at_once(driver: Driver, clock: Clock) -> None:
    sampler = _sampler(clock)
    _polls(sampler, clock, 2)
    driver.running = [(10, 1 << 20), (11, 1 << 20)]
    clock.now += 1.0
    assert [r.fields["t"] for r in sampler.poll().samples] == [1001.0, 1002.0]


def test_a_busy_device_with_no_listed_process_names_host_pids_once_per_read(driver: Driver, clock: Clock) -> None:
    """The agent in its own PID namespace: NVML's list is empty, per-process utilisation gives the host PID."""
    driver.running, driver.per_process, driver.busy_seconds = [], {4242: 80.0}, set(range(990, 1010))
    sampler = _sampler(clock)
    handed = _polls(sampler, clock, 6)
    assert driver.calls["process_utilization"] == 2  # one per read, not one per poll
    for reading in handed[5]:
        assert [(p.pid, p.sm_percent, p.memory_used_bytes) for p in reading.processes or []] == [(4242, 80.0, None)]


def test_an_idle_device_without_processes_says_no_processes(driver: Driver, clock: Clock) -> None:
    driver.running, driver.per_process = [], {}
    (reading,) = _sampler(clock).poll().samples
    assert reading.processes == [] and reading.fields["sm_percent"] == 0.0
    assert driver.calls["process_utilization"] == 0


def test_no_samples_fall_back_to_each_polls_instant_rates(driver: Driver, clock: Clock) -> None:
    driver.samples_found = False
    sampler = _sampler(clock)
    handed = _polls(sampler, clock, 6)
    assert [r.fields["t"] for r in handed[5]] == [1001.0, 1002.0, 1003.0, 1004.0, 1005.0]
    assert [r.fields["sm_percent"] for r in handed[5]] == [8.0, 9.0, 10.0, 11.0, 12.0]
    assert [r.fields["memory_activity_percent"] for r in handed[5]] == [9.0, 10.0, 11.0, 12.0, 13.0]
    assert driver.calls["rates"] == 6


def test_interval_means_split_samples_by_their_timestamps() -> None:
    samples = [(5, 10.0), (15, 20.0), (16, 40.0), (35, 90.0), (1, 99.0)]  # (1, 99): before the first bound
    assert interval_means(samples, [2, 10, 20, 30, 40, 50]) == [10.0, 30.0, 90.0, 90.0, None]
    assert interval_means([], [0, 10]) == [None]


def test_carry_energy_adds_power_times_length() -> None:
    assert carry_energy(1_000.0, [0.0, 1.0, 3.0, 4.0], [100.0, None, 50.0]) == pytest.approx([1_100.0, 1_100.0, 1_150.0])
    assert carry_energy(None, [0.0, 1.0], [100.0]) == [None]


def test_spread_energy_adds_up_to_the_counter_and_follows_power() -> None:
    spread = spread_energy(1_000.0, 1_900.0, [0.0, 1.0, 2.0, 3.0], [100.0, 200.0, 0.0])
    assert spread == pytest.approx([1_300.0, 1_900.0, 1_900.0])
    assert spread_energy(1_000.0, 1_300.0, [0.0, 1.0, 3.0], [None, None]) == pytest.approx([1_100.0, 1_300.0])
    assert spread_energy(None, 500.0, [0.0, 1.0, 2.0], [1.0, 1.0]) == [500.0, 500.0]  # nothing earlier to spread from
    assert spread_energy(900.0, 500.0, [0.0, 1.0, 2.0], [1.0, 1.0]) == [500.0, 500.0]  # the counter went back
    assert spread_energy(900.0, None, [0.0, 1.0], [1.0]) == [None]
    # carried to 900 from a reading of 700: a reading of 800 holds 900, one of 600 is a reload
    assert spread_energy(900.0, 800.0, [0.0, 1.0, 2.0], [1.0, 1.0], 700.0) == [900.0, 900.0]
    assert spread_energy(900.0, 600.0, [0.0, 1.0, 2.0], [1.0, 1.0], 700.0) == [600.0, 600.0]


def test_a_mig_instance_takes_its_gpus_energy_reading(driver: Driver, clock: Clock) -> None:
    """NVML has no energy counter per MIG instance: the GPU's is read once a read, and its instances carry it."""
    sampler = _sampler(clock)
    gpu = sampler.devices[0]
    sampler.devices.append(Device(object(), "MIG-1", 0, "m", parent_uuid="GPU-1", parent_handle=gpu.handle,
                                  util_cursor_us=gpu.util_cursor_us, process_cursor_us=gpu.process_cursor_us))
    sampler._device_set = frozenset({"GPU-1", "MIG-1"})
    handed = _polls(sampler, clock, 6)
    assert driver.calls["energy"] == 2  # the first poll's read and the fifth's, not one per device
    energy = {(r.uuid, r.fields["t"]): r.fields["energy_joules"] for batch in handed for r in batch}
    assert len(energy) == 12
    assert all(energy[("MIG-1", t)] == energy[("GPU-1", t)] for _, t in energy)
    assert energy[("MIG-1", 1005.0)] == pytest.approx(POWER_MW * 1005.0 / 1000)
