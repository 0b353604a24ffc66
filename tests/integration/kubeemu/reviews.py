"""TokenReview and SubjectAccessReview as the real API server answers them, with RBAC behind them.

Authentication is a static token file (`--token-auth-file`): `tokens` maps a bearer token to
its user. Authorisation is RBAC over the Roles, ClusterRoles and their bindings stored in the
emulator, evaluated as the RBAC authorizer does: a ClusterRoleBinding grants its rules in
every namespace and for cluster-scoped requests; a RoleBinding grants its Role's (or
ClusterRole's) rules in its own namespace only; subjects match by User name, Group name or
ServiceAccount (`system:serviceaccount:NS:NAME`, groups `system:serviceaccounts[:NS]`).
Verbs, apiGroups, resources (`resource/subresource`) and resourceNames match exactly or by
`*`. Callers of the two review APIs must themselves be allowed to `create` them
(`system:auth-delegator`); aggregated ClusterRoles and the built-in roles are not emulated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError
from .resources import ResourceType
from .store import ObjectStore

AUTHENTICATION = ("authentication.k8s.io", "v1", "tokenreviews", "TokenReview")
AUTHORIZATION = ("authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview")
#: (group, plural) of the two create-only review resources
REVIEW_RESOURCES = {(AUTHENTICATION[0], AUTHENTICATION[2]), (AUTHORIZATION[0], AUTHORIZATION[2])}


#: the API server's own audience (--api-audiences), which a TokenReview without spec.audiences checks for
API_AUDIENCE = "https://kubernetes.default.svc.cluster.local"


@dataclass
class UserInfo:
    username: str
    uid: str = ""
    groups: list[str] = field(default_factory=list)
    #: what the token was issued for (`kubectl create token --audience`); the API server's own by default
    audiences: list[str] = field(default_factory=lambda: [API_AUDIENCE])

    def as_status_user(self) -> dict[str, Any]:
        """As the API server reports an authenticated user: its groups plus system:authenticated."""
        groups = [*self.groups, "system:authenticated"]
        return {"username": self.username, "uid": self.uid or f"uid-{self.username}", "groups": groups}


def service_account_user(namespace: str, name: str) -> UserInfo:
    """The user a service account's token authenticates as."""
    return UserInfo(f"system:serviceaccount:{namespace}:{name}", f"sa-{namespace}-{name}",
                    ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"])


class Reviews:
    """The two review APIs over the emulator's store."""

    def __init__(self, store: ObjectStore, types: dict[tuple[str, str, str], ResourceType]) -> None:
        self.store = store
        self.types = types
        #: bearer token -> user (the static token file); empty: the review APIs answer anyone
        self.tokens: dict[str, UserInfo] = {}
        #: the SubjectAccessReview specs asked, in order (tests read what the caller sent)
        self.asked: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ the APIs

    def handle(self, kind: str, authorization: str | None, body: Any) -> dict[str, Any]:
        """A POST to tokenreviews or subjectaccessreviews; returns the review with its status."""
        group, version, plural, expected_kind = AUTHENTICATION if kind == "TokenReview" else AUTHORIZATION
        self._check_caller(authorization, group, plural)
        if not isinstance(body, dict) or body.get("kind") != expected_kind or body.get("apiVersion") != f"{group}/{version}":
            raise ApiError(400, "BadRequest", f"the body must be a {group}/{version} {expected_kind}")
        spec = body.get("spec")
        if not isinstance(spec, dict):
            raise ApiError(422, "Invalid", f'{expected_kind}.{group} "" is invalid: spec: Required value')
        status = self._token_review(spec) if kind == "TokenReview" else self._access_review(spec)
        return {"kind": expected_kind, "apiVersion": f"{group}/{version}",
                "metadata": {"creationTimestamp": None}, "spec": spec, "status": status}

    def _check_caller(self, authorization: str | None, group: str, plural: str) -> None:
        if not self.tokens:
            return
        scheme, _, token = (authorization or "").partition(" ")
        caller = self.tokens.get(token.strip()) if scheme == "Bearer" else None
        if caller is None:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        if not self.allowed(caller.username, [*caller.groups, "system:authenticated"],
                            {"verb": "create", "group": group, "resource": plural}):
            raise ApiError(403, "Forbidden", f'{plural}.{group} is forbidden: User "{caller.username}" cannot create '
                                             f'resource "{plural}" in API group "{group}" at the cluster scope')

    def _token_review(self, spec: dict[str, Any]) -> dict[str, Any]:
        token = spec.get("token")
        if not isinstance(token, str) or not token:
            return {"user": {}, "error": "token is empty"}  # what a token authenticator says of ""
        user = self.tokens.get(token)
        if user is None:
            return {"user": {}, "error": "[invalid bearer token, token lookup failed]"}
        wanted = spec.get("audiences") or [API_AUDIENCE]
        common = [audience for audience in wanted if audience in user.audiences]
        if not common:  # as the API server answers a token issued for other audiences
            return {"user": {}, "error": f"[invalid bearer token, token audiences {user.audiences} is invalid for "
                                         f"the target audiences {wanted}]"}
        return {"authenticated": True, "user": user.as_status_user(), "audiences": common}

    def _access_review(self, spec: dict[str, Any]) -> dict[str, Any]:
        user, groups = spec.get("user") or "", spec.get("groups") or []
        if not user and not groups:
            raise ApiError(422, "Invalid", 'SubjectAccessReview.authorization.k8s.io "" is invalid: spec.user: '
                                           'Invalid value: "": at least one of user or group must be specified')
        resource, non_resource = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
        if (resource is None) == (non_resource is None):
            raise ApiError(422, "Invalid", 'SubjectAccessReview.authorization.k8s.io "" is invalid: '
                                           "spec.resourceAttributes: Invalid value: exactly one of nonResourceAttributes "
                                           "or resourceAttributes must be specified")
        self.asked.append(spec)
        if resource is None:
            attributes = non_resource if isinstance(non_resource, dict) else {}
            path, verb = str(attributes.get("path") or ""), str(attributes.get("verb") or "")
            return {"allowed": self._path_allowed(str(user), [str(g) for g in groups], verb, path)}
        reason = self.reason_allowed(str(user), [str(g) for g in groups], resource)
        return {"allowed": True, "reason": reason} if reason else {"allowed": False}

    # ------------------------------------------------------------------ RBAC

    def allowed(self, user: str, groups: list[str], attributes: dict[str, Any]) -> bool:
        return self.reason_allowed(user, groups, attributes) is not None

    def reason_allowed(self, user: str, groups: list[str], attributes: dict[str, Any]) -> str | None:
        """The RBAC authorizer's reason when some binding allows the request, else None."""
        namespace = str(attributes.get("namespace") or "")
        for binding in self._items("clusterrolebindings"):
            if self._binds(binding, user, groups):
                role = self._role(binding, None)
                if role is not None and self._grants(role, attributes):
                    return (f'RBAC: allowed by ClusterRoleBinding "{binding["metadata"]["name"]}" of ClusterRole '
                            f'"{role["metadata"]["name"]}" to {self._who(user)}')
        if namespace:
            for binding in self._items("rolebindings", namespace):
                if self._binds(binding, user, groups):
                    role = self._role(binding, namespace)
                    if role is not None and self._grants(role, attributes):
                        return (f'RBAC: allowed by RoleBinding "{binding["metadata"]["name"]}/{namespace}" of '
                                f'{role["kind"]} "{role["metadata"]["name"]}" to {self._who(user)}')
        return None

    def _path_allowed(self, user: str, groups: list[str], verb: str, path: str) -> bool:
        """nonResourceURLs rules: only ClusterRoles bound cluster-wide grant them; `/x/*` matches by prefix."""
        for binding in self._items("clusterrolebindings"):
            role = self._role(binding, None) if self._binds(binding, user, groups) else None
            for rule in (role or {}).get("rules") or []:
                urls = rule.get("nonResourceURLs") or []
                if _matches(rule.get("verbs"), verb) and any(
                    url == "*" or url == path or (url.endswith("*") and path.startswith(url[:-1])) for url in urls
                ):
                    return True
        return False

    @staticmethod
    def _who(user: str) -> str:
        if user.startswith("system:serviceaccount:"):
            namespace, _, name = user.removeprefix("system:serviceaccount:").partition(":")
            return f'ServiceAccount "{name}/{namespace}"'
        return f'User "{user}"'

    def _items(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        rtype = self.types[("rbac.authorization.k8s.io", "v1", plural)]
        return list(self.store.select(rtype, namespace, None, None))

    def _role(self, binding: dict[str, Any], namespace: str | None) -> dict[str, Any] | None:
        ref = binding.get("roleRef") or {}
        kind, name = ref.get("kind"), ref.get("name")
        if kind == "ClusterRole":
            rtype, role_namespace = self.types[("rbac.authorization.k8s.io", "v1", "clusterroles")], None
        elif kind == "Role" and namespace is not None:
            rtype, role_namespace = self.types[("rbac.authorization.k8s.io", "v1", "roles")], namespace
        else:
            return None
        try:
            return dict(self.store.get(rtype, role_namespace, str(name)))
        except ApiError:
            return None  # a binding to a role that does not exist grants nothing

    @staticmethod
    def _binds(binding: dict[str, Any], user: str, groups: list[str]) -> bool:
        for subject in binding.get("subjects") or []:
            kind, name = subject.get("kind"), subject.get("name")
            if kind == "User" and name == user:
                return True
            if kind == "Group" and name in groups:
                return True
            if kind == "ServiceAccount" and user == f"system:serviceaccount:{subject.get('namespace')}:{name}":
                return True
        return False

    @staticmethod
    def _grants(role: dict[str, Any], attributes: dict[str, Any]) -> bool:
        verb, group = attributes.get("verb") or "", attributes.get("group") or ""
        resource = attributes.get("resource") or ""
        if attributes.get("subresource"):
            resource = f"{resource}/{attributes['subresource']}"
        name = attributes.get("name") or ""
        for rule in role.get("rules") or []:
            if not _matches(rule.get("verbs"), verb) or not _matches(rule.get("apiGroups"), group):
                continue
            if not _matches(rule.get("resources"), resource):
                continue
            names = rule.get("resourceNames") or []
            if names and name not in names:
                continue
            return True
        return False


def _matches(allowed: Any, value: str) -> bool:
    return isinstance(allowed, list) and ("*" in allowed or value in allowed)


def rbac_objects(namespace_grants: dict[str, list[dict[str, Any]]],
                 cluster_grants: list[dict[str, Any]], rules: list[dict[str, Any]],
                 reviewer: dict[str, Any] | None = None) -> list[tuple[str, str | None, dict[str, Any]]]:
    """(collection path, namespace, body) of the Roles/ClusterRoles and bindings that grant `rules`.

    `namespace_grants`: namespace -> subjects given the rules there (Role + RoleBinding);
    `cluster_grants`: subjects given them everywhere (ClusterRole + ClusterRoleBinding);
    `reviewer`: a subject allowed to create TokenReviews and SubjectAccessReviews, as the
    chart grants the gpuwm service account (system:auth-delegator's rules).
    """
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    objects: list[tuple[str, str | None, dict[str, Any]]] = []
    for namespace, subjects in namespace_grants.items():
        objects.append((f"{rbac}/namespaces/{namespace}/roles", namespace,
                        {"metadata": {"name": "reader"}, "rules": rules}))
        objects.append((f"{rbac}/namespaces/{namespace}/rolebindings", namespace, {
            "metadata": {"name": "reader"}, "subjects": subjects,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"}}))
    if cluster_grants:
        objects.append((f"{rbac}/clusterroles", None, {"metadata": {"name": "reader"}, "rules": rules}))
        objects.append((f"{rbac}/clusterrolebindings", None, {
            "metadata": {"name": "reader"}, "subjects": cluster_grants,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "reader"}}))
    if reviewer is not None:
        objects.append((f"{rbac}/clusterroles", None, {"metadata": {"name": "auth-delegator"}, "rules": [
            {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
            {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}]}))
        objects.append((f"{rbac}/clusterrolebindings", None, {
            "metadata": {"name": "auth-delegator"}, "subjects": [reviewer],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "auth-delegator"}}))
    return objects
