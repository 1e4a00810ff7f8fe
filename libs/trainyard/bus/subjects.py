"""Subject and KV-key naming: cluster, kind, namespace and name encoded safely.

NATS subject tokens must not contain ``.``, ``*``, ``>`` or whitespace, and KV keys allow only
``[-/_=.a-zA-Z0-9]``. Kubernetes names may contain dots, so every token is escaped: letters,
digits and ``-`` stay as they are; any other byte (including ``_`` itself) becomes ``_XX`` (two
upper-case hex digits of the UTF-8 byte). The encoding is reversible and the same for subjects
and KV keys. An empty value (the namespace of a cluster-scoped object) is the token ``_``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

EVENTS_PREFIX = "ty.events"
PLANS_PREFIX = "ty.desired"
RESULTS_PREFIX = "ty.results"
DEAD_LETTER_PREFIX = "ty.dead"
PROGRESS_PREFIX = "ty.progress"

EMPTY_TOKEN = "_"
_PLAIN = re.compile(r"[A-Za-z0-9-]")
_ESCAPE = re.compile(r"_([0-9A-F]{2})")


_PLAIN_TOKEN = re.compile(r"[A-Za-z0-9-]+")


def encode_token(value: str) -> str:
    """Encodes one value as a subject token / KV key segment (never empty, never dotted)."""
    if value == "":
        return EMPTY_TOKEN
    if _PLAIN_TOKEN.fullmatch(value):
        return value  # most names: nothing to escape (one match instead of one per character)
    parts: list[str] = []
    for char in value:
        if _PLAIN.fullmatch(char):
            parts.append(char)
        else:
            parts.extend(f"_{byte:02X}" for byte in char.encode("utf-8"))
    return "".join(parts)


def decode_token(token: str) -> str:
    """Reverses :func:`encode_token`."""
    if token == EMPTY_TOKEN:
        return ""
    raw = bytearray()
    index = 0
    while index < len(token):
        match = _ESCAPE.match(token, index)
        if match:
            raw.append(int(match.group(1), 16))
            index = match.end()
        else:
            raw.extend(token[index].encode("utf-8"))
            index += 1
    return raw.decode("utf-8")


# Kinds whose name is shared by several API groups get the group appended on the bus, so
# a coscheduling PodGroup and a Volcano PodGroup of one TrainJob stay two objects.
_GROUP_QUALIFIED_KINDS = frozenset({"PodGroup"})


def bus_kind(api_version: str, kind: str) -> str:
    """The kind token of an object on the bus: ``PodGroup.scheduling.x-k8s.io``, else the kind."""
    if kind in _GROUP_QUALIFIED_KINDS:
        return f"{kind}.{api_version.rpartition('/')[0]}"
    return kind


@dataclass(frozen=True)
class ObjectKey:
    """Identity of one Kubernetes object in one cluster (namespace "" when cluster-scoped)."""

    cluster: str
    kind: str
    namespace: str
    name: str

    def tokens(self) -> str:
        return ".".join(encode_token(v) for v in (self.cluster, self.kind, self.namespace, self.name))

    @classmethod
    def from_tokens(cls, tokens: str) -> "ObjectKey":
        parts = tokens.split(".")
        if len(parts) != 4:
            raise ValueError(f"expected 4 tokens (cluster.kind.namespace.name), got {tokens!r}")
        cluster, kind, namespace, name = (decode_token(p) for p in parts)
        return cls(cluster, kind, namespace, name)

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.cluster}:{self.kind}:{where}"


def event_subject(key: ObjectKey) -> str:
    """``ty.events.<cluster>.<kind>.<namespace>.<name>``."""
    return f"{EVENTS_PREFIX}.{key.tokens()}"


def event_filter(cluster: str | None = None, kind: str | None = None) -> str:
    """A filter subject for events of one kind (and cluster), wildcards elsewhere."""
    cluster_token = encode_token(cluster) if cluster is not None else "*"
    kind_token = encode_token(kind) if kind is not None else "*"
    return f"{EVENTS_PREFIX}.{cluster_token}.{kind_token}.*.*"


def plan_subject(cluster: str, namespace: str, name: str) -> str:
    """``ty.desired.<cluster>.TrainJob.<namespace>.<name>``: one subject per TrainJob."""
    return f"{PLANS_PREFIX}.{ObjectKey(cluster, 'TrainJob', namespace, name).tokens()}"


def result_subject(cluster: str, namespace: str, name: str) -> str:
    """``ty.results.<cluster>.TrainJob.<namespace>.<name>``."""
    return f"{RESULTS_PREFIX}.{ObjectKey(cluster, 'TrainJob', namespace, name).tokens()}"


def progress_subject(cluster: str, namespace: str, name: str) -> str:
    """``ty.progress.<cluster>.TrainJob.<namespace>.<name>``: one TrainJob's progress reports."""
    return f"{PROGRESS_PREFIX}.{ObjectKey(cluster, 'TrainJob', namespace, name).tokens()}"


def dead_letter_subject(original_subject: str) -> str:
    """``ty.dead.<original subject>``: the poison message's subject kept for triage."""
    return f"{DEAD_LETTER_PREFIX}.{original_subject}"


def key_from_subject(subject: str) -> ObjectKey:
    """The object key of an events/plans/results subject (the last four tokens)."""
    tokens = subject.split(".")
    if len(tokens) < 6:
        raise ValueError(f"subject {subject!r} does not end with cluster.kind.namespace.name")
    return ObjectKey.from_tokens(".".join(tokens[-4:]))


def kv_key(key: ObjectKey) -> str:
    """KV key of an object snapshot: ``<cluster>.<kind>.<namespace>.<name>`` (encoded)."""
    return key.tokens()


def kv_prefix(cluster: str, kind: str, namespace: str | None = None) -> str:
    """A KV key filter for all objects of one kind (and namespace)."""
    ns = encode_token(namespace) if namespace is not None else "*"
    return f"{encode_token(cluster)}.{encode_token(kind)}.{ns}.*"
