"""Kubernetes authorization, pure: request attributes from a URL, RBAC rule evaluation over
Roles/ClusterRoles and their bindings, impersonation headers, and kube-apiserver's wording of
a refusal.

The semantics are Kubernetes' (facts carried over, not code):

- **Request attributes** (``request_info``): ``/api/v1/...`` and ``/apis/<group>/<version>/...``
  are resource requests; the verb comes from the method (POST create, GET/HEAD get, PUT update,
  PATCH patch, DELETE delete), a GET without a name is ``list`` or, with ``?watch=true``,
  ``watch``, a DELETE without a name is ``deletecollection``; ``/namespaces/<ns>/...`` sets the
  namespace (``/api/v1/namespaces/<ns>`` itself is in that namespace); a third part is the
  subresource; a ``fieldSelector`` of ``metadata.name=<n>`` on a list or watch names the object.
  Any other path (``/healthz``, ``/api``, ``/apis/<group>/<version>``, ``/openapi/v3``) is a
  non-resource request whose verb is the lower-case method.
- **Rules**: a verb, API group or resource ``*`` matches anything; ``*/<sub>`` matches that
  subresource of every resource; ``resourceNames`` limit a rule to those names (a request with no
  name, e.g. ``list`` or ``create``, never matches a rule with names); a non-resource URL ending
  in ``*`` is a prefix.
- **Subjects**: User by name, Group by membership, ServiceAccount by
  ``system:serviceaccount:<ns>:<name>`` (a subject without a namespace takes the binding's).
  ClusterRoleBindings grant everywhere; RoleBindings (to a Role of their namespace or a
  ClusterRole) only in their namespace. Members of ``system:masters`` are allowed everything
  before RBAC is asked, as kube-apiserver's privileged-group authorizer does.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping
from urllib.parse import unquote

SYSTEM_MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"
UNAUTHENTICATED = "system:unauthenticated"
ANONYMOUS = "system:anonymous"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
SERVICE_ACCOUNTS_GROUP = "system:serviceaccounts"
RBAC_GROUP = "rbac.authorization.k8s.io"
_API_PREFIXES = ("api", "apis")
_SPECIAL_VERBS = ("proxy", "watch")
_NAMESPACE_SUBRESOURCES = ("status", "finalize")
_METHOD_VERBS = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_TRUE = {"1", "t", "T", "true", "TRUE", "True"}


# ---------------------------------------------------------------------------- identities

@dataclass(frozen=True)
class UserInfo:
    """An authenticated (or impersonated) user: name, uid, groups and extra attributes."""

    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """The ``userInfo`` of a SelfSubjectReview / TokenReview."""
        body: dict[str, Any] = {"username": self.name}
        if self.uid:
            body["uid"] = self.uid
        if self.groups:
            body["groups"] = list(self.groups)
        if self.extra:
            body["extra"] = {key: list(values) for key, values in self.extra.items()}
        return body


def service_account_username(namespace: str, name: str) -> str:
    return f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}"


def service_account_groups(namespace: str) -> tuple[str, str]:
    return SERVICE_ACCOUNTS_GROUP, f"{SERVICE_ACCOUNTS_GROUP}:{namespace}"


def split_service_account(username: str) -> tuple[str, str] | None:
    """``system:serviceaccount:<ns>:<name>`` -> ``(ns, name)``; None for any other user name."""
    if not username.startswith(SERVICE_ACCOUNT_PREFIX):
        return None
    parts = username[len(SERVICE_ACCOUNT_PREFIX):].split(":")
    if len(parts) != 2 or not parts[0] or not parts[1]:
        return None
    return parts[0], parts[1]


def service_account_user(namespace: str, name: str, uid: str = "",
                         extra: Mapping[str, tuple[str, ...]] | None = None) -> UserInfo:
    """The user a ServiceAccount token authenticates as."""
    return UserInfo(service_account_username(namespace, name), (*service_account_groups(namespace), AUTHENTICATED),
                    uid, dict(extra or {}))


# ---------------------------------------------------------------------------- attributes

@dataclass(frozen=True)
class Attributes:
    """What a request asks for, as an authorizer sees it."""

    user: UserInfo
    verb: str
    resource_request: bool
    namespace: str = ""
    api_group: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    path: str = ""
    api_version: str = ""


def _exact_name(field_selector: str) -> str:
    """The name a ``metadata.name=<n>`` (or ``==``) term of a field selector requires, if any."""
    for term in field_selector.split(","):
        if "!=" in term:
            continue
        key, sep, value = term.partition("=")
        if sep and key.strip() == "metadata.name":
            return value[1:].strip() if value.startswith("=") else value.strip()
    return ""


def _valid_path_segment(name: str) -> bool:
    return name not in ("", ".", "..") and "/" not in name and "%" not in name


def request_info(user: UserInfo, method: str, path: str, query: Mapping[str, str]) -> Attributes:
    """The authorization attributes of ``method path?query`` (``path`` already URL-decoded per
    segment is fine; empty segments are ignored as kube-apiserver does)."""
    trimmed = path.strip("/")
    parts = trimmed.split("/") if trimmed else []
    non_resource = Attributes(user, method.lower(), False, path=path or "/")
    if len(parts) < 3 or parts[0] not in _API_PREFIXES:
        return non_resource
    prefix, parts = parts[0], parts[1:]
    group = ""
    if prefix != "api":
        if len(parts) < 3:
            return non_resource
        group, parts = parts[0], parts[1:]
    version, parts = parts[0], parts[1:]
    if parts[0] in _SPECIAL_VERBS:
        if len(parts) < 2:
            return non_resource
        verb, parts = parts[0], parts[1:]
        special = True
    else:
        verb, special = _METHOD_VERBS.get(method.upper(), ""), False
    namespace = ""
    if parts[0] == "namespaces":
        if len(parts) > 1:
            namespace = parts[1]
            if len(parts) > 2 and parts[2] not in _NAMESPACE_SUBRESOURCES:
                parts = parts[2:]
    resource = parts[0]
    name = parts[1] if len(parts) > 1 else ""
    subresource = parts[2] if len(parts) > 2 else ""
    if not name and verb == "get" and not special:
        verb = "watch" if query.get("watch", "") in _TRUE else "list"
        selected = _exact_name(query.get("fieldSelector", ""))
        if selected and _valid_path_segment(selected):
            name = selected
    if not name and verb == "delete":
        verb = "deletecollection"
    return Attributes(user, verb, True, namespace, group, resource, subresource, name, path, version)


# ---------------------------------------------------------------------------- rules

def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def verb_matches(rule: Mapping[str, Any], verb: str) -> bool:
    return any(v == "*" or v == verb for v in _strings(rule.get("verbs")))


def api_group_matches(rule: Mapping[str, Any], group: str) -> bool:
    return any(g == "*" or g == group for g in _strings(rule.get("apiGroups")))


def resource_matches(rule: Mapping[str, Any], combined: str, subresource: str) -> bool:
    for resource in _strings(rule.get("resources")):
        if resource == "*" or resource == combined:
            return True
        if subresource and resource == "*/" + subresource:
            return True
    return False


def resource_name_matches(rule: Mapping[str, Any], name: str) -> bool:
    names = _strings(rule.get("resourceNames"))
    return not names or name in names


def non_resource_url_matches(rule: Mapping[str, Any], path: str) -> bool:
    for url in _strings(rule.get("nonResourceURLs")):
        if url == "*" or url == path:
            return True
        if url.endswith("*") and path.startswith(url.rstrip("*")):
            return True
    return False


def rule_allows(attributes: Attributes, rule: Mapping[str, Any]) -> bool:
    """Whether one PolicyRule allows the request."""
    if not verb_matches(rule, attributes.verb):
        return False
    if not attributes.resource_request:
        return non_resource_url_matches(rule, attributes.path)
    combined = attributes.resource + ("/" + attributes.subresource if attributes.subresource else "")
    return (api_group_matches(rule, attributes.api_group)
            and resource_matches(rule, combined, attributes.subresource)
            and resource_name_matches(rule, attributes.name))


def subject_applies(user: UserInfo, subject: Mapping[str, Any], binding_namespace: str) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return user.name == name
    if kind == "Group":
        return name in user.groups
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return bool(namespace) and user.name == service_account_username(str(namespace), str(name))
    return False


def _describe_subject(subject: Mapping[str, Any], binding_namespace: str) -> str:
    if subject.get("kind") == "ServiceAccount":
        return f'{subject.get("kind")} "{subject.get("name")}/{subject.get("namespace") or binding_namespace}"'
    return f'{subject.get("kind")} "{subject.get("name")}"'


# ---------------------------------------------------------------------------- the policy

@dataclass(frozen=True)
class Grant:
    """One rule reached through one binding; ``source`` names the binding as kube-apiserver's
    reason does (``ClusterRoleBinding "x" of ClusterRole "y" to User "z"``)."""

    source: str
    rule: Mapping[str, Any]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _rules(role: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    rules = role.get("rules")
    return [r for r in rules if isinstance(r, dict)] if isinstance(rules, list) else []


class Policy:
    """An RBAC authorizer over a snapshot of Roles, ClusterRoles and their bindings."""

    def __init__(self, roles: Iterable[Mapping[str, Any]], cluster_roles: Iterable[Mapping[str, Any]],
                 role_bindings: Iterable[Mapping[str, Any]], cluster_role_bindings: Iterable[Mapping[str, Any]],
                 privileged_groups: tuple[str, ...] = (SYSTEM_MASTERS,)) -> None:
        self.roles = {(_meta(r).get("namespace", ""), _meta(r).get("name", "")): r for r in roles}
        self.cluster_roles = {_meta(r).get("name", ""): r for r in cluster_roles}
        self.role_bindings: dict[str, list[Mapping[str, Any]]] = {}
        for binding in role_bindings:
            self.role_bindings.setdefault(str(_meta(binding).get("namespace", "")), []).append(binding)
        self.cluster_role_bindings = sorted(cluster_role_bindings, key=lambda b: str(_meta(b).get("name", "")))
        for bindings in self.role_bindings.values():
            bindings.sort(key=lambda b: str(_meta(b).get("name", "")))
        self.privileged_groups = privileged_groups
        # (user, groups, namespace) -> what ``visit`` yields: a Policy is a snapshot, so the
        # grants of a subject never change while it lives (bounded: cleared when it grows large).
        self._visited: dict[tuple[str, tuple[str, ...], str], list[tuple[Grant | None, str | None]]] = {}

    def role_rules(self, ref: Mapping[str, Any], namespace: str) -> tuple[list[Mapping[str, Any]], str | None]:
        kind, name = ref.get("kind"), str(ref.get("name", ""))
        if kind == "ClusterRole":
            role = self.cluster_roles.get(name)
            if role is None:
                return [], f'clusterrole.{RBAC_GROUP} "{name}" not found'
            return _rules(role), None
        if kind == "Role" and namespace:
            role = self.roles.get((namespace, name))
            if role is None:
                return [], f'role.{RBAC_GROUP} "{name}" not found'
            return _rules(role), None
        return [], f'unsupported role reference kind: "{kind}"'

    def visit(self, user: UserInfo, namespace: str) -> Iterator[tuple[Grant | None, str | None]]:
        """Every rule granted to ``user`` for requests in ``namespace`` ("" = cluster scope):
        ClusterRoleBindings first, then the namespace's RoleBindings; ``(None, error)`` for a
        binding whose role does not exist."""
        for binding in self.cluster_role_bindings:
            subject = next((s for s in binding.get("subjects") or [] if isinstance(s, dict)
                            and subject_applies(user, s, "")), None)
            if subject is None:
                continue
            ref = binding.get("roleRef") if isinstance(binding.get("roleRef"), dict) else {}
            rules, error = self.role_rules(ref, "")
            source = (f'ClusterRoleBinding "{_meta(binding).get("name", "")}" of {ref.get("kind")} '
                      f'"{ref.get("name")}" to {_describe_subject(subject, "")}')
            if error:
                yield None, error
            for rule in rules:
                yield Grant(source, rule), None
        if not namespace:
            return
        for binding in self.role_bindings.get(namespace, []):
            subject = next((s for s in binding.get("subjects") or [] if isinstance(s, dict)
                            and subject_applies(user, s, namespace)), None)
            if subject is None:
                continue
            ref = binding.get("roleRef") if isinstance(binding.get("roleRef"), dict) else {}
            rules, error = self.role_rules(ref, namespace)
            source = (f'RoleBinding "{_meta(binding).get("name", "")}/{namespace}" of {ref.get("kind")} '
                      f'"{ref.get("name")}" to {_describe_subject(subject, namespace)}')
            if error:
                yield None, error
            for rule in rules:
                yield Grant(source, rule), None

    def _grants(self, user: UserInfo, namespace: str) -> list[tuple[Grant | None, str | None]]:
        key = (user.name, user.groups, namespace)
        found = self._visited.get(key)
        if found is None:
            if len(self._visited) > 4096:
                self._visited.clear()
            found = self._visited[key] = list(self.visit(user, namespace))
        return found

    def authorize(self, attributes: Attributes) -> tuple[bool, str]:
        """``(allowed, reason)`` as kube-apiserver's RBAC authorizer gives them: the reason names
        the binding that allowed, or (denied) the missing roles met on the way."""
        if any(group in attributes.user.groups for group in self.privileged_groups):
            return True, ""
        problems: list[str] = []
        for grant, error in self._grants(attributes.user, attributes.namespace):
            if grant is not None and rule_allows(attributes, grant.rule):
                return True, f"RBAC: allowed by {grant.source}"
            if error:
                problems.append(error)
        if not problems:
            return False, ""
        return False, "RBAC: " + (problems[0] if len(problems) == 1 else "[" + ", ".join(problems) + "]")

    def rules_for(self, user: UserInfo, namespace: str) -> tuple[list[Mapping[str, Any]], list[str]]:
        """Every rule ``user`` has in ``namespace`` and the errors met (a SelfSubjectRulesReview)."""
        rules: list[Mapping[str, Any]] = []
        problems: list[str] = []
        for grant, error in self.visit(user, namespace):
            if grant is not None:
                rules.append(grant.rule)
            if error:
                problems.append(error)
        return rules, problems


def rules_review_status(rules: list[Mapping[str, Any]], problems: list[str]) -> dict[str, Any]:
    """The ``status`` of a SelfSubjectRulesReview from the rules a user has."""
    resource_rules, non_resource_rules = [], []
    for rule in rules:
        if _strings(rule.get("resources")):
            entry: dict[str, Any] = {"verbs": _strings(rule.get("verbs"))}
            if "apiGroups" in rule:
                entry["apiGroups"] = _strings(rule.get("apiGroups"))
            entry["resources"] = _strings(rule.get("resources"))
            if _strings(rule.get("resourceNames")):
                entry["resourceNames"] = _strings(rule.get("resourceNames"))
            resource_rules.append(entry)
        if _strings(rule.get("nonResourceURLs")):
            non_resource_rules.append({"verbs": _strings(rule.get("verbs")),
                                       "nonResourceURLs": _strings(rule.get("nonResourceURLs"))})
    status: dict[str, Any] = {"resourceRules": resource_rules, "nonResourceRules": non_resource_rules,
                              "incomplete": bool(problems)}
    if problems:
        status["evaluationError"] = problems[0] if len(problems) == 1 else "[" + ", ".join(problems) + "]"
    return status


# ---------------------------------------------------------------------------- escalation

def _single_rules(rule: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A rule broken down into one rule per verb x group x resource x name (or verb x URL)."""
    verbs = _strings(rule.get("verbs"))
    out: list[dict[str, Any]] = []
    resources = _strings(rule.get("resources"))
    if resources:
        names = _strings(rule.get("resourceNames"))
        for group in _strings(rule.get("apiGroups")):
            for resource in resources:
                for verb in verbs:
                    if names:
                        out += [{"apiGroups": [group], "resources": [resource], "resourceNames": [n], "verbs": [verb]}
                                for n in names]
                    else:
                        out.append({"apiGroups": [group], "resources": [resource], "verbs": [verb]})
    for url in _strings(rule.get("nonResourceURLs")):
        out += [{"nonResourceURLs": [url], "verbs": [verb]} for verb in verbs]
    return out


def _covers(owner: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether ``owner`` grants all of the single rule ``wanted`` (a wildcard is only covered
    by the same wildcard)."""
    verbs = _strings(owner.get("verbs"))
    if "*" not in verbs and wanted["verbs"][0] not in verbs:
        return False
    if "nonResourceURLs" in wanted:
        url = wanted["nonResourceURLs"][0]
        return any(o == "*" or o == url or (o.endswith("*") and url.startswith(o.rstrip("*")))
                   for o in _strings(owner.get("nonResourceURLs")))
    groups = _strings(owner.get("apiGroups"))
    if "*" not in groups and wanted["apiGroups"][0] not in groups:
        return False
    resources, resource = _strings(owner.get("resources")), wanted["resources"][0]
    if "*" not in resources and resource not in resources and \
            not ("/" in resource and "*/" + resource.split("/", 1)[1] in resources):
        return False
    names = _strings(owner.get("resourceNames"))
    return not names or bool(wanted.get("resourceNames")) and wanted["resourceNames"][0] in names


def missing_rules(held: Iterable[Mapping[str, Any]], granted: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The parts of ``granted`` that the ``held`` rules do not cover (an escalation)."""
    held = list(held)
    return [single for rule in granted for single in _single_rules(rule)
            if not any(_covers(owner, single) for owner in held)]


def _go_strings(values: list[str]) -> str:
    return "[" + " ".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "]"


def escalation_message(user: UserInfo, missing: list[dict[str, Any]]) -> str:
    """kube-apiserver's text for a Role or binding granting more than its writer holds."""
    lines = []
    for rule in missing:
        parts = [f"{label}:{_go_strings(rule[key])}" for label, key in
                 (("APIGroups", "apiGroups"), ("Resources", "resources"), ("NonResourceURLs", "nonResourceURLs"),
                  ("ResourceNames", "resourceNames"), ("Verbs", "verbs")) if rule.get(key)]
        lines.append("{" + ", ".join(parts) + "}")
    return (f'user "{user.name}" (groups={_go_strings(list(user.groups))}) is attempting to grant RBAC permissions '
            "not currently held:\n" + "\n".join(lines))


# ---------------------------------------------------------------------------- refusals

def _sanitize(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def forbidden(attributes: Attributes, reason: str = "") -> tuple[str, dict[str, Any]]:
    """kube-apiserver's 403 for a refused request: ``(message, details)``.

    ``pods "p" is forbidden: User "u" cannot get resource "pods" in API group "" in the namespace "ns"``;
    ``... at the cluster scope`` without a namespace; ``"pods/log"`` for a subresource;
    ``forbidden: User "u" cannot get path "/metrics"`` for a non-resource URL."""
    user = attributes.user.name
    if not attributes.resource_request:
        why = f'User "{user}" cannot {attributes.verb} path "{attributes.path}"'
    else:
        resource = attributes.resource + ("/" + attributes.subresource if attributes.subresource else "")
        why = f'User "{user}" cannot {attributes.verb} resource "{resource}" in API group "{attributes.api_group}"'
        why += f' in the namespace "{attributes.namespace}"' if attributes.namespace else " at the cluster scope"
    why = _sanitize(why)
    if reason:
        why += ": " + reason
    details: dict[str, Any] = {}
    if not attributes.resource_request or not attributes.resource:
        return f"forbidden: {why}", details
    qualified = attributes.resource + ("." + attributes.api_group if attributes.api_group else "")
    if attributes.name:
        details["name"] = attributes.name
    if attributes.api_group:
        details["group"] = attributes.api_group
    details["kind"] = attributes.resource
    if attributes.name:
        return f'{qualified} "{attributes.name}" is forbidden: {why}', details
    return f"{qualified} is forbidden: {why}", details


# ---------------------------------------------------------------------------- impersonation

IMPERSONATE_USER = "Impersonate-User"
IMPERSONATE_GROUP = "Impersonate-Group"
IMPERSONATE_UID = "Impersonate-Uid"
IMPERSONATE_EXTRA_PREFIX = "Impersonate-Extra-"


class ImpersonationError(ValueError):
    """Impersonation headers that cannot be honoured (e.g. a group without a user)."""


@dataclass(frozen=True)
class ImpersonationRequest:
    """One thing the requester asks to act as; ``check`` is what it must be allowed to impersonate."""

    kind: str  # User, ServiceAccount, Group, UserExtra, UID
    name: str
    namespace: str = ""
    extra_key: str = ""

    def attributes(self, requester: UserInfo) -> Attributes:
        if self.kind == "User":
            return Attributes(requester, "impersonate", True, "", "", "users", "", self.name, api_version="v1")
        if self.kind == "ServiceAccount":
            return Attributes(requester, "impersonate", True, self.namespace, "", "serviceaccounts", "", self.name,
                              api_version="v1")
        if self.kind == "Group":
            return Attributes(requester, "impersonate", True, "", "", "groups", "", self.name, api_version="v1")
        if self.kind == "UserExtra":
            return Attributes(requester, "impersonate", True, "", "authentication.k8s.io", "userextras",
                              self.extra_key, self.name, api_version="v1")
        return Attributes(requester, "impersonate", True, "", "authentication.k8s.io", "uids", "", self.name,
                          api_version="v1")


def impersonation_requests(headers: Iterable[tuple[str, str]]) -> list[ImpersonationRequest]:
    """The impersonation asked by request headers, in kube-apiserver's order (user, groups,
    extras, uid); empty without impersonation headers."""
    pairs = list(headers)
    users = [v for k, v in pairs if k.lower() == IMPERSONATE_USER.lower() and v]
    requests: list[ImpersonationRequest] = []
    if users:
        account = split_service_account(users[0])
        if account is not None:
            requests.append(ImpersonationRequest("ServiceAccount", account[1], account[0]))
        else:
            requests.append(ImpersonationRequest("User", users[0]))
    others = False
    for key, value in pairs:
        if key.lower() == IMPERSONATE_GROUP.lower():
            requests.append(ImpersonationRequest("Group", value))
            others = True
    for key, value in pairs:
        if key.lower().startswith(IMPERSONATE_EXTRA_PREFIX.lower()):
            raw = key[len(IMPERSONATE_EXTRA_PREFIX):].lower()
            try:
                extra_key = unquote(raw, errors="strict")
            except UnicodeDecodeError:
                extra_key = raw
            requests.append(ImpersonationRequest("UserExtra", value, extra_key=extra_key))
            others = True
    uids = [v for k, v in pairs if k.lower() == IMPERSONATE_UID.lower() and v]
    if uids:
        requests.append(ImpersonationRequest("UID", uids[0]))
        others = True
    if others and not users:
        described = ", ".join(f"{r.kind} {r.name!r}" for r in requests)
        raise ImpersonationError(f"requested [{described}] without impersonating a user")
    return requests


def impersonated_user(requests: list[ImpersonationRequest]) -> UserInfo:
    """The user a request acts as once every impersonation request is allowed."""
    groups: list[str] = []
    extra: dict[str, list[str]] = {}
    name, uid = "", ""
    groups_given = any(r.kind == "Group" for r in requests)
    for request in requests:
        if request.kind == "User":
            name = request.name
        elif request.kind == "ServiceAccount":
            name = service_account_username(request.namespace, request.name)
            if not groups_given:
                groups.extend(service_account_groups(request.namespace))
        elif request.kind == "Group":
            groups.append(request.name)
        elif request.kind == "UserExtra":
            extra.setdefault(request.extra_key, []).append(request.name)
        elif request.kind == "UID":
            uid = request.name
    if name != ANONYMOUS:
        if not any(g in (AUTHENTICATED, UNAUTHENTICATED) for g in groups):
            groups.append(AUTHENTICATED)
    elif UNAUTHENTICATED not in groups:
        groups.append(UNAUTHENTICATED)
    return UserInfo(name, tuple(groups), uid, {k: tuple(v) for k, v in extra.items()})
