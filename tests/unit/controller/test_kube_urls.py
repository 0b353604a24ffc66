"""The client's prebuilt URLs (status writes, creates) are the ones aiohttp would have built from path and params."""

from __future__ import annotations

import pytest
from yarl import URL

from gpuwm.controller.kube import FIELD_MANAGER_PARAMS, KubeClient, resource_path

SERVERS = ["http://127.0.0.1:8080", "https://api.example.com:6443", "https://10.0.0.1", "https://h.example/prefix/"]
PATHS = [
    resource_path("gpuwm.io/v1alpha1", "gpuworkloadmetrics", "team-01", "job-00001") + "/status",
    resource_path("gpuwm.io/v1alpha1", "gpuprojectmetrics", None, "p.q-1"),
    resource_path("v1", "pods", "ns", "x"),
    resource_path("gpuwm.io/v1alpha1", "gpuworkloadmetrics", "ns"),
]


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("params", [None, FIELD_MANAGER_PARAMS])
def test_prebuilt_urls_equal_what_aiohttp_builds(server: str, path: str, params: dict[str, str] | None) -> None:
    client = KubeClient(server)
    url, query = client._url(path, params)
    expected = URL(client.server + path)
    if params:
        expected = expected.extend_query(params)
    assert isinstance(url, URL) and query is None
    assert url == expected and str(url) == str(expected) and url.raw_path_qs == expected.raw_path_qs


@pytest.mark.parametrize(("server", "path", "params"), [
    ("http://h", "/api/v1/namespaces/a b/pods", FIELD_MANAGER_PARAMS),  # needs quoting: aiohttp does it
    ("https://[::1]:6443", "/api/v1/pods", None),
    ("http://h", "/api/v1/pods", {"fieldSelector": "metadata.name=x"}),  # other queries: aiohttp encodes them
])
def test_anything_else_goes_to_aiohttp_as_before(server: str, path: str, params: dict[str, str] | None) -> None:
    client = KubeClient(server)
    assert client._url(path, params) == (client.server + path, params)
