"""What each idle-policy step does to a workload object: pure builders of the one API call, and its sending.

A builder reads the object as just fetched and returns the `Change` that carries the step out (a
merge patch or a delete), or raises `NotApplicable` saying why it cannot (a RawDeployment
InferenceService cannot scale to zero; a RayCluster without worker groups has nothing to scale).
Where a kind has a scale subresource, scaling goes through it, as `kubectl scale` does; a Kueue-admitted
workload is suspended by deactivating its Kueue Workload (`spec.active: false`, as Kueue asks), never
through its own `suspend`, which Kueue would undo.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gpuwm.accounting import Step
from gpuwm.controller.kube import KubeClient, resource_path
from gpuwm.controller.status import rfc3339

NOTEBOOK_STOP_ANNOTATION = "kubeflow-resource-stopped"
KSERVE_MODE_ANNOTATION = "serving.kserve.io/deploymentMode"
KUEUE_GROUP = "kueue.x-k8s.io"
#: the Kueue API versions tried in turn (the newest Kueue serves v1beta2)
KUEUE_VERSIONS = ("v1beta2", "v1beta1")
_SCALE_SUBRESOURCE_KINDS = {"Deployment", "StatefulSet", "LeaderWorkerSet"}
_KUBEFLOW_RUN_POLICY_KINDS = {"PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob"}
_SPEC_SUSPEND_KINDS = {"Job", "JobSet", "TrainJob", "RayJob"}


class NotApplicable(Exception):
    """The step cannot act on this object; the message says why."""


@dataclass(frozen=True)
class Change:
    """One API call: a merge patch (`body`) or a delete of `path`, and what it does in words."""

    method: Literal["PATCH", "DELETE"]
    path: str
    body: dict[str, Any] | None
    description: str


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def scale_change(step: Step, path: str, obj: Mapping[str, Any], now: float) -> Change | None:
    """Scale to zero; None where it is at zero already."""
    kind = step.kind
    if kind in _SCALE_SUBRESOURCE_KINDS:
        if _spec(obj).get("replicas") == 0:
            return None
        return Change("PATCH", path + "/scale", {"spec": {"replicas": 0}}, f"scaled {kind} {step.name} to 0 replicas")
    if kind == "Notebook":
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        if NOTEBOOK_STOP_ANNOTATION in annotations:
            return None
        return Change("PATCH", path, {"metadata": {"annotations": {NOTEBOOK_STOP_ANNOTATION: rfc3339(now)}}},
                      f"stopped Notebook {step.name} ({NOTEBOOK_STOP_ANNOTATION})")
    if kind == "RayCluster":
        return _ray_workers_change(step, path, obj)
    if kind == "InferenceService":
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        if annotations.get(KSERVE_MODE_ANNOTATION) == "RawDeployment":
            raise NotApplicable("a RawDeployment InferenceService cannot scale to zero (Serverless mode can)")
        predictor = _spec(obj).get("predictor") or {}
        if predictor.get("minReplicas") == 0:
            return None
        return Change("PATCH", path, {"spec": {"predictor": {"minReplicas": 0}}},
                      f"let InferenceService {step.name}'s predictor scale to zero (minReplicas 0)")
    raise NotApplicable(f"{kind} has no way to scale to zero")


def _ray_workers_change(step: Step, path: str, obj: Mapping[str, Any]) -> Change | None:
    groups = _spec(obj).get("workerGroupSpecs")
    if not isinstance(groups, list) or not groups:
        raise NotApplicable(f"RayCluster {step.name} has no worker groups to scale")
    if all(isinstance(group, Mapping) and group.get("replicas") == 0 and group.get("minReplicas", 0) == 0
           for group in groups):
        return None
    # a merge patch replaces a list whole: the groups as read, with their replicas at 0
    zeroed = [{**group, "replicas": 0, "minReplicas": 0} for group in groups if isinstance(group, Mapping)]
    version = (obj.get("metadata") or {}).get("resourceVersion")
    metadata = {"resourceVersion": version} if version else {}
    return Change("PATCH", path, {"metadata": metadata, "spec": {"workerGroupSpecs": zeroed}},
                  f"scaled RayCluster {step.name}'s {len(zeroed)} worker group(s) to 0")


def suspend_change(step: Step, path: str, obj: Mapping[str, Any]) -> Change | None:
    """Suspend through the object's own field; None where it is suspended already."""
    spec = _spec(obj)
    if step.kind in _KUBEFLOW_RUN_POLICY_KINDS:
        if (spec.get("runPolicy") or {}).get("suspend") is True:
            return None
        return Change("PATCH", path, {"spec": {"runPolicy": {"suspend": True}}},
                      f"suspended {step.kind} {step.name} (runPolicy.suspend)")
    if step.kind in _SPEC_SUSPEND_KINDS:
        if spec.get("suspend") is True:
            return None
        return Change("PATCH", path, {"spec": {"suspend": True}}, f"suspended {step.kind} {step.name}")
    raise NotApplicable(f"{step.kind} cannot be suspended")


def kueue_change(step: Step, kueue_path: str, kueue_workload: Mapping[str, Any]) -> Change | None:
    """Deactivate the Kueue Workload of a Kueue-admitted workload; None where it is inactive already."""
    if _spec(kueue_workload).get("active") is False:
        return None
    name = (kueue_workload.get("metadata") or {}).get("name")
    return Change("PATCH", kueue_path, {"spec": {"active": False}},
                  f"deactivated Kueue Workload {name} of {step.kind} {step.name} (spec.active false)")


def delete_change(step: Step, path: str) -> Change:
    return Change("DELETE", path, {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"},
                  f"deleted {step.kind} {step.name}")


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(isinstance(ref, Mapping) and ref.get("uid") == uid
               for ref in (obj.get("metadata") or {}).get("ownerReferences") or [])


class Actuator:
    """Fetches a step's workload object and sends the change that carries the step out."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client

    async def object_path(self, step: Step) -> str:
        plural = await self.client.plural(step.api_version, step.kind)
        if plural is None:
            raise NotApplicable(f"{step.api_version} {step.kind} is not served by the API server")
        return resource_path(step.api_version, plural, step.namespace, step.name)

    async def fetch(self, step: Step) -> dict[str, Any] | None:
        """The workload object as it is now; None when it is gone or is another object of the same name."""
        found = await self.client.get(await self.object_path(step))
        if found is None or (found.get("metadata") or {}).get("uid") != step.uid:
            return None
        return found

    async def change_for(self, step: Step, obj: Mapping[str, Any], now: float) -> Change | None:
        """The change a step makes to `obj` (None: nothing to change); NotApplicable where it cannot."""
        path = await self.object_path(step)
        if step.action == "scaleToZero":
            return scale_change(step, path, obj, now)
        if step.action == "suspend":
            if step.via_kueue:
                kueue_path, kueue_workload = await self._kueue_workload(step)
                return kueue_change(step, kueue_path, kueue_workload)
            return suspend_change(step, path, obj)
        if step.action == "delete":
            return delete_change(step, path)
        raise NotApplicable(f"{step.action} changes no object")

    async def _kueue_workload(self, step: Step) -> tuple[str, dict[str, Any]]:
        for version in KUEUE_VERSIONS:
            api_version = f"{KUEUE_GROUP}/{version}"
            if not await self.client.served(api_version, "workloads"):
                continue
            collection = resource_path(api_version, "workloads", step.namespace)
            for item in await self.client.list_items(collection):
                if owned_by(item, step.uid):
                    name = str((item.get("metadata") or {}).get("name"))
                    return f"{collection}/{name}", item
            raise NotApplicable(f"no Kueue Workload in {step.namespace} is owned by {step.kind} {step.name}")
        raise NotApplicable("Kueue's Workload kind is not served by the API server")

    async def send(self, change: Change) -> None:
        if change.method == "DELETE":
            await self.client.request("DELETE", change.path, body=change.body)
        else:
            await self.client.merge_patch(change.path, change.body or {})

