"""Authorization of the devcluster API server: RBAC over the stored Roles, ClusterRoles and
bindings (``trainyard.apimachinery.rbac``), impersonation, the default bootstrap policy, and the
access reviews (SelfSubjectAccessReview, SubjectAccessReview, LocalSubjectAccessReview,
SelfSubjectRulesReview, SelfSubjectReview) that ``kubectl auth can-i`` / ``whoami`` ask.

Modes (``trainyard devcluster up --authorization-mode``): ``RBAC`` (the default) refuses what no
binding allows with kube-apiserver's 403; ``AlwaysAllow`` allows every authenticated request
(authentication still applies) and answers every access review with allowed.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from trainyard.apimachinery import rbac
from trainyard.apimachinery import rbac_bootstrap

from .. import errors
from ..registry.kinds import Registry, ResourceType
from ..registry.store import Api, WriteOptions

MODES = ("RBAC", "AlwaysAllow")
_RBAC_KINDS = ("roles", "clusterroles", "rolebindings", "clusterrolebindings")
_ALWAYS_ALLOW_REASON = "the devcluster runs with --authorization-mode AlwaysAllow"


def forbidden_error(attributes: rbac.Attributes, reason: str = "") -> errors.ApiError:
    message, details = rbac.forbidden(attributes, reason)
    return errors.ApiError(403, "Forbidden", message, details or None)


class Authorization:
    def __init__(self, api: Api, registry: Registry, mode: str = "RBAC") -> None:
        if mode not in MODES:
            raise ValueError(f"unknown authorization mode {mode!r}; choose from {', '.join(MODES)}")
        self.api = api
        self.registry = registry
        self.mode = mode
        self._policy: rbac.Policy | None = None
        self._policy_rv = -1
        self._fingerprint: tuple = ()
        # the review kinds (create-only, never stored), each answered by its handler
        self._reviews: dict[str, Callable[[ResourceType, dict[str, Any], rbac.UserInfo, str | None],
                                          dict[str, Any]]] = {
            "SelfSubjectReview": self._self_review,
            "SelfSubjectRulesReview": self._rules_review,
            "SelfSubjectAccessReview": self._self_access_review,
            "SubjectAccessReview": self._access_review,
            "LocalSubjectAccessReview": self._local_access_review,
        }

    # ---------------------------------------------------------------- policy snapshot

    def _types(self) -> list[ResourceType]:
        types = [self.registry.lookup(rbac.RBAC_GROUP, "v1", kind) for kind in _RBAC_KINDS]
        return [t for t in types if t is not None]

    def policy(self) -> rbac.Policy:
        """The RBAC objects as stored now; rebuilt only when one of them changed."""
        store = self.api.store
        if self._policy is not None and store.rv == self._policy_rv:
            return self._policy
        # Every write moves store.rv; the RBAC objects are read again only when one of them was
        # written or deleted since (not listed and compared on every request after any write).
        types = self._types()
        fingerprint = tuple(store.changed_at(t.storage_key) for t in types)
        if self._policy is None or fingerprint != self._fingerprint:
            loaded = [[s.load() for _, s in store.list(t.storage_key)] for t in types]
            self._policy = rbac.Policy(*loaded)
            self._fingerprint = fingerprint
        self._policy_rv = store.rv
        return self._policy

    # ---------------------------------------------------------------- decisions

    def decide(self, attributes: rbac.Attributes) -> tuple[bool, str]:
        if self.mode == "AlwaysAllow":
            return True, ""
        return self.policy().authorize(attributes)

    def check(self, attributes: rbac.Attributes) -> None:
        """Raise kube-apiserver's 403 unless the request is allowed."""
        allowed, reason = self.decide(attributes)
        if not allowed:
            raise forbidden_error(attributes, reason)

    def check_create_on_update(self, user: rbac.UserInfo, rt: ResourceType, namespace: str | None, name: str) -> None:
        """A server-side apply that creates the object also needs ``create`` (with the name, so
        a rule's resourceNames can allow it), as kube-apiserver checks it; its refusal is
        ``<resource> "<name>" is forbidden: <reason>``."""
        attributes = rbac.Attributes(user, "create", True, namespace or "", rt.group, rt.resource, "", name,
                                     api_version=rt.version)
        allowed, reason = self.decide(attributes)
        if not allowed:
            details: dict[str, Any] = {"name": name, **({"group": rt.group} if rt.group else {}), "kind": rt.resource}
            raise errors.ApiError(403, "Forbidden", f'{rt.qualified_resource} "{name}" is forbidden: {reason}', details)

    def guard_rbac_write(self, check: str, rt: ResourceType, obj: dict[str, Any], opts: WriteOptions) -> None:
        """Kubernetes' escalation prevention on a Role/ClusterRole (``check`` "rules", the kind's
        strategy says) or binding ("binding") written by a user: allowed when the user is in
        system:masters, may ``escalate`` (roles) or ``bind`` (the referenced role), or already
        holds every permission granted; else 403."""
        user = opts.user
        if not isinstance(user, rbac.UserInfo) or self.mode == "AlwaysAllow" or opts.dry_run:
            return
        policy = self.policy()
        if any(group in user.groups for group in policy.privileged_groups):
            return
        meta = obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        if check == "rules":
            if self.decide(rbac.Attributes(user, "escalate", True, namespace, rt.group, rt.resource, "", name))[0]:
                return
            granted = obj.get("rules") if isinstance(obj.get("rules"), list) else []
        else:
            ref = obj.get("roleRef") if isinstance(obj.get("roleRef"), dict) else {}
            role_resource = "clusterroles" if ref.get("kind") == "ClusterRole" else "roles"
            bind = rbac.Attributes(user, "bind", True, namespace, rt.group, role_resource, "", str(ref.get("name", "")))
            if self.decide(bind)[0]:
                return
            granted, _ = policy.role_rules(ref, namespace)
        held, _ = policy.rules_for(user, namespace)
        missing = rbac.missing_rules(held, [r for r in granted if isinstance(r, dict)])
        if missing:
            details: dict[str, Any] = {"name": name, "group": rt.group, "kind": rt.resource}
            raise errors.ApiError(403, "Forbidden", f'{rt.qualified_resource} "{name}" is forbidden: '
                                  + rbac.escalation_message(user, missing), details)

    def impersonate(self, headers: Iterable[tuple[str, str]], user: rbac.UserInfo) -> rbac.UserInfo:
        """The user a request acts as: ``user`` itself, or whom its ``Impersonate-*`` headers name
        once ``user`` may impersonate each of them (the ``impersonate`` verb on users, groups,
        serviceaccounts in their namespace, uids and userextras/<key>)."""
        try:
            requests = rbac.impersonation_requests(headers)
        except rbac.ImpersonationError as err:
            raise errors.bad_request(str(err)) from None
        if not requests:
            return user
        for request in requests:
            self.check(request.attributes(user))
        return rbac.impersonated_user(requests)

    # ---------------------------------------------------------------- bootstrap

    async def bootstrap(self) -> None:
        """kube-apiserver's default ClusterRoles and ClusterRoleBindings, created when missing
        (an existing one, e.g. edited by an administrator, is kept)."""
        roles = self.registry.lookup(rbac.RBAC_GROUP, "v1", "clusterroles")
        bindings = self.registry.lookup(rbac.RBAC_GROUP, "v1", "clusterrolebindings")
        assert roles is not None and bindings is not None
        for rt, objects in ((roles, rbac_bootstrap.cluster_roles()), (bindings, rbac_bootstrap.cluster_role_bindings())):
            for obj in objects:
                if self.api.store.get(rt.storage_key, "", obj["metadata"]["name"]) is None:
                    try:
                        await self.api.create(rt, None, obj, WriteOptions(manager="devcluster"))
                    except errors.ApiError as err:
                        if err.code != 409:
                            raise

    # ---------------------------------------------------------------- reviews

    def review(self, rt: ResourceType, body: Any, user: rbac.UserInfo, namespace: str | None) -> dict[str, Any]:
        """The answer (with ``status``) to a review the request's user created."""
        if not isinstance(body, dict):
            raise errors.bad_request(f"the body of a {rt.kind} must be a JSON object")
        answer = dict(body, apiVersion=rt.api_version, kind=rt.kind)
        if answer.get("metadata") is not None and not isinstance(answer["metadata"], dict):
            raise errors.bad_request("metadata must be a JSON object")
        meta = dict(answer.get("metadata") or {})
        meta.setdefault("creationTimestamp", None)
        answer["metadata"] = meta
        spec = answer.get("spec") if isinstance(answer.get("spec"), dict) else {}
        handler = self._reviews.get(rt.kind)
        if handler is None:
            raise errors.not_found_path()
        answer["status"] = handler(rt, spec, user, namespace)
        return answer

    # the review kinds, each answered by its handler (kube-apiserver: a REST storage per kind)

    def _self_review(self, rt: ResourceType, spec: dict[str, Any], user: rbac.UserInfo,
                     namespace: str | None) -> dict[str, Any]:
        return {"userInfo": user.as_json()}

    def _rules_review(self, rt: ResourceType, spec: dict[str, Any], user: rbac.UserInfo,
                      namespace: str | None) -> dict[str, Any]:
        if self.mode == "AlwaysAllow":
            return {"resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
                    "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}], "incomplete": False}
        rules, problems = self.policy().rules_for(user, str(spec.get("namespace") or ""))
        return rbac.rules_review_status(rules, problems)

    def _self_access_review(self, rt: ResourceType, spec: dict[str, Any], user: rbac.UserInfo,
                            namespace: str | None) -> dict[str, Any]:
        return self._access_status(self._review_attributes(rt, spec, user))

    def _access_review(self, rt: ResourceType, spec: dict[str, Any], user: rbac.UserInfo,
                       namespace: str | None) -> dict[str, Any]:
        return self._access_status(self._review_attributes(rt, spec, self._review_subject(rt, spec)))

    def _local_access_review(self, rt: ResourceType, spec: dict[str, Any], user: rbac.UserInfo,
                             namespace: str | None) -> dict[str, Any]:
        """A SubjectAccessReview bound to the request's namespace: resource attributes only, in it."""
        subject = self._review_subject(rt, spec)
        return self._access_status(self._review_attributes(rt, spec, subject, local_to=namespace or ""))

    def _access_status(self, attributes: rbac.Attributes) -> dict[str, Any]:
        allowed, reason = self.decide(attributes)
        status: dict[str, Any] = {"allowed": allowed}
        if self.mode == "AlwaysAllow":
            reason = _ALWAYS_ALLOW_REASON
        if reason:
            status["reason"] = reason
        return status

    def _invalid(self, rt: ResourceType, field: str, message: str) -> errors.ApiError:
        return errors.invalid(rt.qualified_kind, "", rt.group, rt.kind,
                              [errors.field_cause(field, "FieldValueInvalid", message)])

    def _review_subject(self, rt: ResourceType, spec: dict[str, Any]) -> rbac.UserInfo:
        name = spec.get("user") or ""
        groups = spec.get("groups") or []
        if not isinstance(name, str) or not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise self._invalid(rt, "spec.user", "Invalid value: user must be a string and groups a list of strings")
        if not name and not groups:
            raise self._invalid(rt, "spec.user", 'Invalid value: "": at least one of user or group must be specified')
        extra = spec.get("extra") if isinstance(spec.get("extra"), dict) else {}
        return rbac.UserInfo(name, tuple(groups), str(spec.get("uid") or ""),
                             {str(k): tuple(v) for k, v in extra.items() if isinstance(v, list)})

    def _review_attributes(self, rt: ResourceType, spec: dict[str, Any], subject: rbac.UserInfo,
                           local_to: str | None = None) -> rbac.Attributes:
        """The attributes a review asks about; ``local_to``: the namespace a local review is bound
        to (no non-resource attributes, no other namespace)."""
        resource = spec.get("resourceAttributes")
        non_resource = spec.get("nonResourceAttributes")
        if (resource is None) == (non_resource is None):
            raise self._invalid(rt, "spec.resourceAttributes",
                                f'Invalid value: "{"null" if resource is None else "object"}": exactly one of '
                                "nonResourceAttributes or resourceAttributes must be specified")
        if non_resource is not None:
            if local_to is not None:
                raise self._invalid(rt, "spec.nonResourceAttributes",
                                    "Invalid value: disallowed on this kind of request")
            if not isinstance(non_resource, dict):
                raise self._invalid(rt, "spec.nonResourceAttributes", "Invalid value: must be an object")
            return rbac.Attributes(subject, str(non_resource.get("verb") or ""), False,
                                   path=str(non_resource.get("path") or ""))
        if not isinstance(resource, dict):
            raise self._invalid(rt, "spec.resourceAttributes", "Invalid value: must be an object")
        ns = str(resource.get("namespace") or "")
        if local_to is not None:
            if ns and ns != local_to:
                raise self._invalid(rt, "spec.resourceAttributes.namespace",
                                    f'Invalid value: "{ns}": must match metadata.namespace')
            ns = local_to
        return rbac.Attributes(subject, str(resource.get("verb") or ""), True, ns, str(resource.get("group") or ""),
                               str(resource.get("resource") or ""), str(resource.get("subresource") or ""),
                               str(resource.get("name") or ""), api_version=str(resource.get("version") or ""))
