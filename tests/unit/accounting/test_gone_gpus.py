"""GPUs that stopped reporting long ago and that nothing holds are forgotten (autoscaled nodes)."""

from __future__ import annotations

from tests.unit.accounting.helpers import engine, figures, pod, sample


def test_a_removed_nodes_gpus_leave_the_cluster_after_an_hour() -> None:
    e = engine(interval_seconds=15.0)
    for t in range(0, 301, 15):  # node n2 (GPU-b) reports for five minutes, then its node is gone
        e.observe(sample(float(t), "GPU-a", sm=50))
        e.observe(sample(float(t), "GPU-b", node="n2", sm=50))
    assert e.cluster(300).gpus == 2 and e.cluster(300).total_gpu_units == 2.0
    for t in range(315, 3600 + 301, 15):
        e.observe(sample(float(t), "GPU-a", sm=50))
    assert e.cluster(3600 + 300).gpus == 2  # an hour of silence: unmonitored, still there
    for t in range(3600 + 315, 3600 + 400, 15):
        e.observe(sample(float(t), "GPU-a", sm=50))
    assert "GPU-b" not in e.gpu_records
    cluster = e.cluster(3600 + 390)
    assert cluster.gpus == 1 and cluster.total_gpu_units == 1.0
    # it comes back: a new history from its next sample
    e.observe(sample(3600 + 405.0, "GPU-b", node="n2", sm=50))
    assert e.cluster(3600 + 405).gpus == 2


def test_a_held_gpu_stays_however_long_it_is_silent() -> None:
    e = engine(interval_seconds=15.0)
    e.observe(pod(0.0, "train", devices=[("GPU-b", 1.0)]))
    for t in range(15, 301, 15):
        e.observe(sample(float(t), "GPU-a", sm=50))
        e.observe(sample(float(t), "GPU-b", node="n2", sm=50))
    for t in range(315, 2 * 3600, 15):
        e.observe(sample(float(t), "GPU-a", sm=50))
    assert "GPU-b" in e.gpu_records
    train = figures(e, "train", 2 * 3600 - 15)
    assert train.allocated_gpus == 1.0
    assert train.unmonitored_gpu_seconds >= 2 * 3600 - 400  # the silence is unmonitored, not idle


def test_mig_instances_and_their_parent_go_together() -> None:
    e = engine(interval_seconds=15.0)
    for t in range(0, 301, 15):
        e.observe(sample(float(t), "GPU-a", sm=50))
        e.observe(sample(float(t), "GPU-p", node="n2", sm=None, energy_joules=1000.0 + t))
        e.observe(sample(float(t), "MIG-1", node="n2", sm=40, parent_uuid="GPU-p", device_units=3 / 7))
    assert e.mig_children == {"GPU-p": ["MIG-1"]}
    for t in range(315, 3600 + 400, 15):
        e.observe(sample(float(t), "GPU-a", sm=50))
    assert set(e.gpu_records) == {"GPU-a"} and e.mig_children == {}
