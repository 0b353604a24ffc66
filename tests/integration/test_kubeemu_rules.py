"""Rules kube-apiserver enforces that the emulator keeps too, one test per rule the controller could meet."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.kubeemu import EmulatorThread, KubeHttp, KubernetesEmulator, minimal_crd
from tests.integration.test_kubeemu import CRDS, GWM, _read_events, _workload_cr


@pytest.fixture
def emu() -> Iterator[EmulatorThread]:
    with EmulatorThread(KubernetesEmulator(CRDS)) as thread:
        KubeHttp(thread.url).create("/api/v1/namespaces", {"metadata": {"name": "team-a"}})
        yield thread


def test_labels_and_names_follow_object_meta_rules(emu: EmulatorThread) -> None:
    http = KubeHttp(emu.url)
    long_value = "x" * 64
    status, error = http.request("POST", GWM, {**_workload_cr(), "metadata": {"name": "train",
                                                                               "labels": {"gpuwm.io/name": long_value}}})
    assert status == 422 and "must be no more than 63 characters" in error["message"]
    for bad in ("-starts-with-dash", "has space", "ends.", "a/b"):
        status, error = http.request("POST", GWM, {**_workload_cr(), "metadata": {"name": "t", "labels": {"k": bad}}})
        assert status == 422 and "metadata.labels" in error["message"], bad
    status, error = http.request("POST", GWM, {**_workload_cr(), "metadata": {"name": "t", "labels": {"Bad_Prefix/k": "v"}}})
    assert status == 422 and "prefix part" in error["message"]
    assert http.create(GWM, {**_workload_cr(), "metadata": {"name": "t", "labels": {"k": "A-b_c.9", "e": ""}}})
    status, error = http.request("POST", GWM, {**_workload_cr(), "metadata": {"name": "x" * 254}})
    assert status == 422 and "metadata.name" in error["message"]
    status, error = http.request("POST", GWM, {**_workload_cr(), "metadata": {"name": "Upper"}})
    assert status == 422 and "RFC 1123 subdomain" in error["message"]
    status, error = http.request("POST", "/api/v1/namespaces", {"metadata": {"name": "dotted.name"}})
    assert status == 422 and "RFC 1123 label" in error["message"]  # namespaces are labels, not subdomains
    # labels are checked on updates too
    status, error = http.request("PATCH", f"{GWM}/t", {"metadata": {"labels": {"k": long_value}}},
                                 "application/merge-patch+json")
    assert status == 422 and "63 characters" in error["message"]


def test_generate_name_keeps_58_characters_and_adds_5(emu: EmulatorThread) -> None:
    http = KubeHttp(emu.url)
    created = http.create(GWM, {**_workload_cr(), "metadata": {"generateName": "w" * 70 + "."}})
    name = created["metadata"]["name"]
    assert name.startswith("w" * 58) and len(name) == 63 and "." not in name


def test_body_namespace_must_match_the_url(emu: EmulatorThread) -> None:
    http = KubeHttp(emu.url)
    status, error = http.request("POST", GWM, {**_workload_cr(), "metadata": {"name": "t", "namespace": "other"}})
    assert status == 400 and "does not match the namespace" in error["message"]


def _legacy_event(**extra: object) -> dict[str, object]:
    return {"metadata": {"generateName": "train."},
            "involvedObject": {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "namespace": "team-a"},
            "reason": "GpuIdle", "message": "idle", "type": "Warning", "source": {"component": "gpuwm"},
            "firstTimestamp": "2026-01-02T03:04:05Z", "lastTimestamp": "2026-01-02T03:04:05Z", "count": 1, **extra}


def test_core_v1_events_are_validated_like_the_api_server(emu: EmulatorThread) -> None:
    http = KubeHttp(emu.url)
    events = "/api/v1/namespaces/team-a/events"
    assert http.create(events, _legacy_event())["metadata"]["name"].startswith("train.")
    wrong_namespace = _legacy_event(involvedObject={"kind": "Job", "name": "train", "namespace": "elsewhere"})
    status, error = http.request("POST", events, wrong_namespace)
    assert status == 422 and "does not match event.namespace" in error["message"]
    # with eventTime (the "new" form through core/v1) the reporting fields become required
    status, error = http.request("POST", events, _legacy_event(eventTime="2026-01-02T03:04:05.000000Z"))
    assert status == 422 and "reportingComponent: Required value" in error["message"]
    assert "action: Required value" in error["message"] and "reportingInstance: Required value" in error["message"]
    full = _legacy_event(eventTime="2026-01-02T03:04:05.123456Z", reportingComponent="gpuwm.io/controller",
                         reportingInstance="gpuwm-0", action="Observe")
    assert http.create(events, full)
    status, error = http.request("POST", events, {**full, "message": "m" * 1025})
    assert status == 422 and "at most 1024 characters" in error["message"]
    status, error = http.request("POST", events, {**full, "action": "a" * 129})
    assert status == 422 and "at most 128 characters" in error["message"]
    # MicroTime needs exactly six fractional digits: anything else does not even decode
    status, error = http.request("POST", events, {**full, "eventTime": "2026-01-02T03:04:05Z"})
    assert status == 400 and "2006-01-02T15:04:05.000000Z07:00" in error["message"]


def test_events_k8s_io_v1_is_strict(emu: EmulatorThread) -> None:
    http = KubeHttp(emu.url)
    events = "/apis/events.k8s.io/v1/namespaces/team-a/events"
    good: dict[str, Any] = {"metadata": {"generateName": "train."}, "eventTime": "2026-01-02T03:04:05.000001Z",
            "regarding": {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "namespace": "team-a"},
            "reason": "GpuIdle", "note": "idle", "type": "Warning", "action": "Observe",
            "reportingController": "gpuwm.io/controller", "reportingInstance": "gpuwm-0"}
    assert http.create(events, good)
    changes: list[tuple[dict[str, Any], str]] = [
        ({"type": "Info"}, "type: Invalid value"),
        ({"eventTime": None}, "eventTime: Required value"),
        ({"reportingController": None}, "reportingController: Required value"),
        ({"note": "n" * 1025}, "note: Invalid value"),
        ({"deprecatedCount": 2}, "deprecatedCount: Invalid value"),
        ({"deprecatedSource": {"component": "gpuwm"}}, "deprecatedSource: Invalid value"),
    ]
    for change, complaint in changes:
        status, error = http.request("POST", events, {k: v for k, v in {**good, **change}.items() if v is not None})
        assert status == 422 and complaint in error["message"], (change, error)


async def test_a_terminating_namespace_refuses_new_content(emu: EmulatorThread) -> None:
    http = KubeHttp(emu.url)
    emu.emulator.namespace_termination_seconds = 0.5
    http.create(GWM, _workload_cr())
    deleted = http.ok("DELETE", "/api/v1/namespaces/team-a")
    assert deleted["status"]["phase"] == "Terminating" and deleted["metadata"]["deletionTimestamp"]
    status, error = http.request("POST", GWM, _workload_cr("late"))
    assert status == 403 and error["reason"] == "Forbidden"
    assert "unable to create new content in namespace team-a because it is being terminated" in error["message"]
    status, _ = http.request("PATCH", f"{GWM}/train/status", {"status": {"allocatedGpus": 1}},
                             "application/merge-patch+json")
    assert status == 200  # updates of what is still there are allowed until the content goes
    for _ in range(50):
        await asyncio.sleep(0.1)
        if http.request("GET", "/api/v1/namespaces/team-a")[0] == 404:
            break
    assert http.request("GET", f"{GWM}/train")[0] == 404
    status, error = http.request("POST", GWM, _workload_cr("later"))
    assert status == 404 and error["message"] == 'namespaces "team-a" not found'


def test_field_selectors_are_limited_per_kind(emu: EmulatorThread) -> None:
    http = KubeHttp(emu.url)
    http.create(GWM, _workload_cr())
    assert len(http.get(GWM, fieldSelector="metadata.name=train")["items"]) == 1
    status, error = http.request("GET", GWM, params={"fieldSelector": "spec.project=team-a"})
    assert status == 400 and "not a known field selector" in error["message"]
    assert http.get("/api/v1/pods", fieldSelector="spec.nodeName=n1,status.phase=Running")["items"] == []


def test_schema_integers_formats_and_nulls(emu: EmulatorThread) -> None:
    http = KubeHttp(emu.url)
    crd = minimal_crd("example.io", "v1", "Widget", "widgets")
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = {"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "count": {"type": "integer"}, "at": {"type": "string", "format": "date-time"},
            "note": {"type": "string"}, "maybe": {"type": "string", "nullable": True},
            "tags": {"type": "array", "items": {"type": "string"}}}}}}
    http.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    widgets = "/apis/example.io/v1/namespaces/team-a/widgets"
    status, error = http.request("POST", widgets, {"metadata": {"name": "w"}, "spec": {"count": 3.5}})
    assert status == 422 and "spec.count" in error["message"] and "integer" in error["message"]
    assert http.create(widgets, {"metadata": {"name": "w0"}, "spec": {"count": 3.0}})["spec"]["count"] == 3
    status, error = http.request("POST", widgets, {"metadata": {"name": "w"}, "spec": {"at": "2026-01-02 03:04"}})
    assert status == 422 and "date-time" in error["message"]
    assert http.create(widgets, {"metadata": {"name": "w1"}, "spec": {"at": "2026-01-02T03:04:05.5+01:00"}})
    # a null where null is not allowed is pruned; where it is allowed, kept; a null list item is an error
    created = http.create(widgets, {"metadata": {"name": "w2"}, "spec": {"note": None, "maybe": None}})
    assert created["spec"] == {"maybe": None}
    status, error = http.request("POST", widgets, {"metadata": {"name": "w3"}, "spec": {"tags": ["a", None]}})
    assert status == 422 and "spec.tags[1]" in error["message"]


def test_pod_spec_is_immutable_and_bound_through_binding(emu: EmulatorThread) -> None:
    http = KubeHttp(emu.url)
    pods = "/api/v1/namespaces/team-a/pods"
    http.create(pods, {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "a"}]}})
    status, error = http.request("PATCH", f"{pods}/p", {"spec": {"nodeName": "n1"}}, "application/merge-patch+json")
    assert status == 422 and "pod updates may not change fields" in error["message"]
    status, _ = http.request("PATCH", f"{pods}/p/status", {"spec": {"nodeName": "n1"}, "status": {"phase": "Running"}},
                             "application/merge-patch+json")
    assert status == 200 and "nodeName" not in http.get(f"{pods}/p")["spec"]  # /status cannot set it either
    assert http.ok("PATCH", f"{pods}/p", {"spec": {"containers": [{"name": "c", "image": "b"}]}},
                   "application/merge-patch+json")["spec"]["containers"][0]["image"] == "b"  # images may change
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"},
               "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}}
    assert http.ok("POST", f"{pods}/p/binding", binding)["status"] == "Success"
    assert http.get(f"{pods}/p")["spec"]["nodeName"] == "n1"
    status, error = http.request("POST", f"{pods}/p/binding", {**binding, "target": {"kind": "Node", "name": "n2"}})
    assert status == 409 and 'already assigned to node "n1"' in error["message"]


def test_nan_is_not_json(emu: EmulatorThread) -> None:
    http = KubeHttp(emu.url)
    http.create(GWM, _workload_cr())
    status, error = http.request("PATCH", f"{GWM}/train/status", b'{"status": {"allocatedGpus": NaN}}',
                                 "application/merge-patch+json")
    assert status == 400 and "NaN" in error["message"]


def test_events_are_one_kind_seen_through_two_apis(emu: EmulatorThread) -> None:
    http = KubeHttp(emu.url)
    core = "/api/v1/namespaces/team-a/events"
    v1 = "/apis/events.k8s.io/v1/namespaces/team-a/events"
    http.create(core, _legacy_event(eventTime="2026-01-02T03:04:05.000001Z", reportingComponent="gpuwm-controller",
                                    reportingInstance="gpuwm-0", action="Observe"))
    http.create(v1, {"metadata": {"name": "from-v1"}, "eventTime": "2026-01-02T03:04:06.000000Z",
                     "regarding": {"kind": "Job", "name": "train", "namespace": "team-a"}, "reason": "GpuIdle",
                     "note": "idle", "type": "Normal", "action": "Observe", "reportingController": "x.io/y",
                     "reportingInstance": "y-0"})
    http.create(core, _legacy_event())  # no eventTime
    seen_v1 = http.get(v1)["items"]
    assert len(seen_v1) == 3 and {e["regarding"]["name"] for e in seen_v1} == {"train"}
    with_time = [e for e in seen_v1 if e["eventTime"]]
    assert len(with_time) == 2 and {e["reportingController"] for e in with_time} == {"gpuwm-controller", "x.io/y"}
    assert next(e for e in seen_v1 if e["eventTime"] is None)["deprecatedCount"] == 1
    seen_core = http.get(core)["items"]
    assert [e["message"] for e in seen_core if e["metadata"]["name"] == "from-v1"] == ["idle"]
    assert http.get(f"{v1}/from-v1")["note"] == "idle"


async def test_quiet_watches_get_bookmarks(emu: EmulatorThread) -> None:
    emu.emulator.bookmark_seconds = 0.2
    version = emu.emulator.store.resource_version
    url = f"{emu.url}/api/v1/pods?watch=true&allowWatchBookmarks=true&resourceVersion={version}&timeoutSeconds=5"
    events = await _read_events(url, 2)
    assert [e["type"] for e in events] == ["BOOKMARK", "BOOKMARK"]
    assert events[0]["object"]["metadata"]["resourceVersion"] == str(version)  # type: ignore[index]
    plain = f"{emu.url}/api/v1/pods?watch=true&resourceVersion={version}&timeoutSeconds=1"
    assert await _read_events(plain, 1, timeout=3) == []  # not asked for: none


async def test_scheduled_pods_are_deleted_gracefully(emu: EmulatorThread) -> None:
    http = KubeHttp(emu.url)
    pods = "/api/v1/namespaces/team-a/pods"
    emu.emulator.kubelet_delete_seconds = None  # no kubelet: nothing confirms a graceful deletion
    for name, node in (("scheduled", "n1"), ("unscheduled", None), ("forced", "n1")):
        http.create(pods, {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "i"}],
                                                                **({"nodeName": node} if node else {})}})
    going = http.ok("DELETE", f"{pods}/scheduled")
    assert going["metadata"]["deletionTimestamp"] and going["metadata"]["deletionGracePeriodSeconds"] == 30
    assert http.get(f"{pods}/scheduled")["metadata"]["deletionTimestamp"]  # Terminating, still there
    http.ok("DELETE", f"{pods}/unscheduled")
    assert http.request("GET", f"{pods}/unscheduled")[0] == 404  # never scheduled: gone at once
    http.ok("DELETE", f"{pods}/forced", params={"gracePeriodSeconds": "0"})
    assert http.request("GET", f"{pods}/forced")[0] == 404
    emu.emulator.kubelet_delete_seconds = 0.1  # with a kubelet: it confirms soon
    http.create(pods, {"metadata": {"name": "run"}, "spec": {"nodeName": "n1", "containers": []}})
    http.ok("DELETE", f"{pods}/run")
    for _ in range(30):
        await asyncio.sleep(0.05)
        if http.request("GET", f"{pods}/run")[0] == 404:
            break
    assert http.request("GET", f"{pods}/run")[0] == 404


READ_METRICS = [{"apiGroups": ["gpuwm.io"], "resources": ["gpuworkloadmetrics"], "verbs": ["get", "list"]}]


def _review_cluster(emu: EmulatorThread) -> None:
    """alice reads team-a through her group; admin everything; the gpuwm service account may ask reviews."""
    from tests.integration.kubeemu.reviews import UserInfo, rbac_objects, service_account_user

    emu.emulator.reviews.tokens.update({
        "sa-token": service_account_user("gpuwm", "gpuwm-controller"),
        "alice-token": UserInfo("alice", groups=["team-a-devs"]),
        "admin-token": UserInfo("admin"),
        "bob-token": UserInfo("bob"),
    })
    http = KubeHttp(emu.url)
    for path, _, body in rbac_objects(
        {"team-a": [{"kind": "Group", "name": "team-a-devs", "apiGroup": "rbac.authorization.k8s.io"}]},
        [{"kind": "User", "name": "admin", "apiGroup": "rbac.authorization.k8s.io"}], READ_METRICS,
        reviewer={"kind": "ServiceAccount", "name": "gpuwm-controller", "namespace": "gpuwm"},
    ):
        http.create(path, body)


def _access(http: KubeHttp, user: str, groups: list[str], **attributes: str) -> Any:
    return http.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": groups, "resourceAttributes": attributes}})["status"]


def test_token_reviews_authenticate_from_the_token_file(emu: EmulatorThread) -> None:
    _review_cluster(emu)
    http = KubeHttp(emu.url, token="sa-token")
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "alice-token"}}
    status = http.create("/apis/authentication.k8s.io/v1/tokenreviews", review)["status"]
    assert status["authenticated"] is True and status["user"]["username"] == "alice"
    assert set(status["user"]["groups"]) == {"team-a-devs", "system:authenticated"}
    unknown = http.create("/apis/authentication.k8s.io/v1/tokenreviews", {**review, "spec": {"token": "nope"}})
    assert not unknown["status"].get("authenticated") and unknown["status"]["user"] == {}
    # who asks must be allowed to: no token is 401, a user without auth-delegator's rules 403
    assert KubeHttp(emu.url).request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", review)[0] == 401
    status_code, error = KubeHttp(emu.url, token="bob-token").request(
        "POST", "/apis/authentication.k8s.io/v1/tokenreviews", review)
    assert status_code == 403 and 'cannot create resource "tokenreviews"' in error["message"]
    assert http.request("GET", "/apis/authentication.k8s.io/v1/tokenreviews")[0] == 405


def test_access_reviews_follow_rbac(emu: EmulatorThread) -> None:
    _review_cluster(emu)
    http = KubeHttp(emu.url, token="sa-token")
    get = {"verb": "get", "group": "gpuwm.io", "resource": "gpuworkloadmetrics"}
    allowed = _access(http, "alice", ["team-a-devs", "system:authenticated"], namespace="team-a", **get)
    assert allowed["allowed"] is True and 'RoleBinding "reader/team-a"' in allowed["reason"]
    # a RoleBinding grants in its own namespace only, never at the cluster scope
    assert _access(http, "alice", ["team-a-devs"], namespace="team-b", **get) == {"allowed": False}
    assert _access(http, "alice", ["team-a-devs"], **get) == {"allowed": False}
    # the group is what binds alice: without it, nothing
    assert _access(http, "alice", [], namespace="team-a", **get) == {"allowed": False}
    # verb, group and resource must all match a rule
    assert not _access(http, "alice", ["team-a-devs"], namespace="team-a", **{**get, "verb": "delete"})["allowed"]
    assert not _access(http, "alice", ["team-a-devs"], namespace="team-a", **{**get, "group": ""})["allowed"]
    assert not _access(http, "alice", ["team-a-devs"], namespace="team-a",
                       **{**get, "resource": "gpuprojectmetrics"})["allowed"]
    # a ClusterRoleBinding grants everywhere and at the cluster scope
    assert _access(http, "admin", [], **get)["allowed"] is True
    assert _access(http, "admin", [], namespace="team-b", **get)["allowed"] is True
    status_code, error = http.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {"resourceAttributes": get}})
    assert status_code == 422 and "at least one of user or group" in error["message"]
