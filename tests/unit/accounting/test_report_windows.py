"""`Engine.workload(uid, now)` at the latest report's `now` reads that report's window sums, until the next input.

The status writer renders a few hundred CRs between cycles, each at its report's time. The
figures must be those a fresh computation gives, to the bit, whether or not the report's sums
are reused, and any input after the report (a late sample, a batch of samples, a pod event,
a namespace, a forgotten workload) must be seen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gpuwm.accounting import Engine, EngineConfig
from gpuwm.accounting import windows as windows_module
from gpuwm.model import NamespaceEvent

from .helpers import batch_of_samples, pod, sample

CONFIG = EngineConfig(interval_seconds=10.0, late_event_window_seconds=600.0)
NOW = 1000.0


def _engine() -> Engine:
    """Two running workloads with an hour of varied samples (enough segments for the numpy path)."""
    engine = Engine(CONFIG)
    engine.observe(pod(0.0, "train", devices=[("GPU-a", 1.0)]))
    engine.observe(pod(0.0, "serve", devices=[("GPU-b", 0.5)]))
    for t in range(10, int(NOW), 10):
        engine.observe(sample(float(t), "GPU-a", sm=float(t % 97), memory_used_bytes=float(t % 13)))
        engine.observe(sample(float(t), "GPU-b", sm=float(t % 31) * 3, memory_used_bytes=float(t % 7)))
    return engine


def _fresh(engine: Engine, uid: str, now: float) -> dict[str, Any]:
    """The figures computed from the engine's state as it is, without any report's sums."""
    return engine._compute_figures(engine.workload_records[uid], now, None)[0].model_dump()


def _no_window_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any) -> None:
        raise AssertionError("the window sums were computed again")

    monkeypatch.setattr(windows_module, "windows_of", refuse)
    monkeypatch.setattr("gpuwm.accounting.engine.windows_of", refuse)


def test_figures_at_the_reports_time_reuse_its_sums_and_equal_a_fresh_computation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = _engine()
    reported = {figures.uid: figures.model_dump() for figures in engine.report(NOW)[0]}
    expected = {uid: _fresh(engine, uid, NOW) for uid in reported}
    assert len(engine.workload_records["wl-train"].windows) >= 24  # the numpy path, where reuse pays
    _no_window_pass(monkeypatch)
    for uid, figures in reported.items():
        rendered = engine.workload(uid, NOW)
        assert rendered is not None
        assert rendered.model_dump() == figures == expected[uid]


def test_another_time_computes_its_own_sums() -> None:
    engine = _engine()
    engine.report(NOW)
    later = engine.workload("wl-train", NOW + 5.0)
    at_report = engine.workload("wl-train", NOW)
    assert later is not None and later.model_dump() == _fresh(engine, "wl-train", NOW + 5.0)
    assert at_report is not None and later.utilization.avg1m != at_report.utilization.avg1m


def _late_sample(engine: Engine) -> None:
    engine.observe(sample(500.0, "GPU-a", sm=100.0, memory_used_bytes=99.0))  # replaces t=500: the 1h window moves


def _late_batch(engine: Engine) -> None:
    engine.observe_samples(batch_of_samples([sample(960.0, "GPU-a", sm=1.0), sample(970.0, "GPU-b", sm=99.0)]))


def _pod_ends_early(engine: Engine) -> None:
    engine.observe(pod(950.0, "train", "Succeeded", devices=[]))  # late: the last 50 s are taken back


def _relabelled_much_later(engine: Engine) -> None:
    # the clock moves on by 3,000 s: maintenance trims the segments past its hour, the report's hour among them
    engine.observe(NamespaceEvent(t=NOW + 3000.0, event="namespace", name="ml", labels={"gpuwm.io/project": "vision"}))


@pytest.mark.parametrize("given", [_late_sample, _late_batch, _pod_ends_early, _relabelled_much_later],
                         ids=["late sample", "batch of samples", "late pod event", "namespace"])
def test_any_input_after_the_report_is_seen(given: Callable[[Engine], None]) -> None:
    engine = _engine()
    before = {figures.uid: figures.model_dump() for figures in engine.report(NOW)[0]}
    given(engine)
    changed = False
    for uid in before:
        rendered = engine.workload(uid, NOW)
        assert rendered is not None and rendered.model_dump() == _fresh(engine, uid, NOW)
        dumped = rendered.model_dump()
        changed = changed or any(dumped[name] != before[uid][name] for name in ("utilization", "memory_utilization"))
    assert changed  # the input did change a window at the report's time


def test_a_forgotten_workload_is_gone_and_the_others_are_fresh() -> None:
    engine = _engine()
    engine.report(NOW)
    engine.forget_workload("wl-serve")
    assert engine.workload("wl-serve", NOW) is None
    train = engine.workload("wl-train", NOW)
    assert train is not None and train.model_dump() == _fresh(engine, "wl-train", NOW)


def test_the_report_order_follows_workloads_that_come_and_go() -> None:
    """The sorted workloads are kept between reports: a new one or a forgotten one must show at once."""
    engine = _engine()
    assert [figures.uid for figures in engine.report(NOW)[0]] == ["wl-serve", "wl-train"]
    engine.observe(pod(NOW, "alpha", devices=[("GPU-c", 1.0)]))  # sorts first (namespace, name, uid)
    assert [figures.uid for figures in engine.report(NOW)[0]] == ["wl-alpha", "wl-serve", "wl-train"]
    engine.forget_workload("wl-serve")
    engine.observe(pod(NOW, "zulu", devices=[("GPU-d", 1.0)]))  # as many workloads as before, another set
    assert [figures.uid for figures in engine.report(NOW)[0]] == ["wl-alpha", "wl-train", "wl-zulu"]
