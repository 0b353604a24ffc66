"""Host figures through the HTTP API: a workload's CPU as percent of its request and limit, memory
request and limit, disk rates and ephemeral-storage limit on the range API (embedded store), by pod too."""

from __future__ import annotations

from pathlib import Path

import httpx

from gpuwm.api.app import create_app
from gpuwm.config import Settings
from gpuwm.store.embedded import EmbeddedStore
from tests.unit.store.test_store_host_metrics import HOST, _record
from tests.unit.store.test_store_payloads import SMALL_TIERS


async def test_host_figures_on_the_workload_range_api(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path / "s.db", tiers=SMALL_TIERS)
    _record(store, [0.0, 15.0, 30.0])
    app = create_app(store, Settings(auth="none"))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gpuwm") as http:
            for path in ("/api/v1/namespaces/team-a/workloads/a/metrics", "/api/v1/workloads/uid-a/metrics"):
                answer = await http.get(path, params={"start": "0", "end": "30", "step": "15", "metric": ",".join(HOST)})
                assert answer.status_code == 200, answer.text
                values = {s["metric"]: [p[1] for p in s["points"]] for s in answer.json()["series"]}
                assert values["cpu_usage_percent_of_limit"] == [75.0, 75.0, 75.0]
                assert values["cpu_usage_percent_of_request"] == [150.0, 150.0, 150.0]
                assert values["memory_limit_bytes"] == [8e9] * 3 and values["memory_request_bytes"] == [4e9] * 3
                assert values["disk_read_bytes_per_second"] == [1000.0] * 3
                assert values["ephemeral_storage_limit_bytes"] == [1e10] * 3
            by_pod = await http.get("/api/v1/namespaces/team-a/workloads/b/metrics", params={
                "start": "0", "end": "30", "step": "15", "metric": "cpu_usage_cores,cpu_usage_percent_of_limit",
                "by": "pod"})
            assert by_pod.status_code == 200, by_pod.text
            series = {s["metric"]: s for s in by_pod.json()["series"]}
            assert series["cpu_usage_cores"]["labels"]["pod"] == "b-0"
            assert [p[1] for p in series["cpu_usage_cores"]["points"]] == [1.0, 1.0, 1.0]
            assert [p[1] for p in series["cpu_usage_percent_of_limit"]["points"]] == [None, None, None]  # no limit
    finally:
        store.close()
