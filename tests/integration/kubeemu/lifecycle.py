"""Namespace and pod lifecycle rules of the real API server, as a mixin of the emulator.

NamespaceLifecycle admission (no content in a namespace that is missing or Terminating: 404
and 403), the namespace controller emptying a deleted namespace after a while, and the
scheduler's `pods/NAME/binding`, the only way to set spec.nodeName after creation.
"""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from .errors import ApiError
from .resources import ResourceType
from .store import ObjectStore, now_rfc3339


class LifecycleRules:
    """Needs `store`, `types` and `namespace_termination_seconds` from the emulator."""

    store: ObjectStore
    types: dict[tuple[str, str, str], ResourceType]
    namespace_termination_seconds: float
    kubelet_delete_seconds: float | None

    def _delete_pod(self, rtype: ResourceType, namespace: str | None, name: str, grace: str | None) -> dict[str, Any]:
        """Graceful deletion (`CheckGracefulDelete`): a scheduled pod that has not finished gets a
        deletionTimestamp `grace` seconds ahead and stays until its kubelet confirms (DELETE with
        grace 0); unscheduled or finished pods, and `gracePeriodSeconds=0`, go at once."""
        pod = self.store.get(rtype, namespace, name)
        spec, metadata = pod.get("spec") or {}, pod["metadata"]
        seconds = int(grace) if grace not in {None, ""} else int(spec.get("terminationGracePeriodSeconds", 30))
        finished = (pod.get("status") or {}).get("phase") in {"Succeeded", "Failed"}
        if seconds <= 0 or not spec.get("nodeName") or finished:
            return self.store.delete(rtype, namespace, name)
        if metadata.get("deletionTimestamp"):
            return pod
        deadline = datetime.now(tz=UTC) + timedelta(seconds=seconds)
        going = copy.deepcopy(pod)
        going["metadata"]["deletionGracePeriodSeconds"] = seconds
        terminating = self.store.mark_deleting(rtype, going, deadline.strftime("%Y-%m-%dT%H:%M:%SZ"))
        if self.kubelet_delete_seconds is not None:
            asyncio.get_running_loop().call_later(self.kubelet_delete_seconds, self._kubelet_confirms, rtype,
                                                  namespace, name, metadata["uid"])
        return terminating

    def _kubelet_confirms(self, rtype: ResourceType, namespace: str | None, name: str, uid: str) -> None:
        current = self.store.bucket(rtype).get((namespace or "", name))
        if current is not None and current["metadata"]["uid"] == uid:
            self.store.remove(rtype, current)

    def _check_namespace(self, rtype: ResourceType, namespace: str | None, body: Any = None) -> None:
        """The namespace exists, is not being terminated, and the body does not name another one."""
        if not rtype.namespaced:
            return
        if namespace is None:
            raise ApiError(404, "NotFound", f"{rtype.plural} must be created in a namespace")
        metadata = (body.get("metadata") or {}) if isinstance(body, dict) else {}
        if metadata.get("namespace") not in {None, "", namespace}:
            raise ApiError(400, "BadRequest", "the namespace of the provided object does not match the namespace "
                                              "sent on the request")
        found = self.store.bucket(self.types[("", "v1", "namespaces")]).get(("", namespace))
        if found is None:
            raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found')
        if found["metadata"].get("deletionTimestamp"):
            name = metadata.get("name") or metadata.get("generateName") or ""
            raise ApiError(403, "Forbidden", f'{rtype.plural}{"." + rtype.group if rtype.group else ""} "{name}" is '
                                             f"forbidden: unable to create new content in namespace {namespace} "
                                             "because it is being terminated")

    def _bind(self, rtype: ResourceType, namespace: str | None, name: str, body: Any) -> dict[str, Any]:
        """POST pods/NAME/binding: what the scheduler does, the only way to set spec.nodeName after creation."""
        target = (body.get("target") or {}) if isinstance(body, dict) else {}
        if target.get("kind", "Node") != "Node" or not target.get("name"):
            raise ApiError(422, "Invalid", 'Binding is invalid: target: Invalid value: must name a Node')
        old = self.store.get(rtype, namespace, name)
        bound = (old.get("spec") or {}).get("nodeName")
        if bound:
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is '
                                            f'already assigned to node "{bound}"')
        new = copy.deepcopy(old)
        new.setdefault("spec", {})["nodeName"] = str(target["name"])
        self.store.replace(rtype, old, new, "kube-scheduler", "binding")
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def _terminate_namespace(self, rtype: ResourceType, name: str) -> dict[str, Any]:
        """DELETE of a namespace: Terminating first (creates get 403), content and namespace go later.

        The real namespace controller empties the namespace after the DELETE returns; until it is
        done the namespace has a deletionTimestamp and phase Terminating.
        """
        old = self.store.get(rtype, None, name)
        if old["metadata"].get("deletionTimestamp"):
            return old
        terminating = self.store.mark_deleting(rtype, old, now_rfc3339(), status={"phase": "Terminating"})
        if self.namespace_termination_seconds <= 0:
            self._finish_namespace(rtype, name)
        else:
            asyncio.get_running_loop().call_later(self.namespace_termination_seconds, self._finish_namespace,
                                                  rtype, name)
        return terminating

    def _finish_namespace(self, rtype: ResourceType, name: str) -> None:
        self._delete_namespace_content(name)
        if ("", name) in self.store.bucket(rtype):
            self.store.remove(rtype, self.store.get(rtype, None, name))

    def _delete_namespace_content(self, namespace: str) -> None:
        seen: set[tuple[str, str]] = set()
        for rtype in list(self.types.values()):
            if rtype.namespaced and (rtype.group, rtype.plural) not in seen:
                seen.add((rtype.group, rtype.plural))
                for obj in self.store.select(rtype, namespace):
                    self.store.delete(rtype, namespace, obj["metadata"]["name"])
