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

# Partitions (docs/bus.md, "Partitions and home replicas"): every TrainJob, and everything it
# owns, is on one partition: ``p<N>``, N a stable hash of the TrainJob's namespace/name modulo
# the partition count. Objects of no TrainJob (runtimes, PriorityClasses) are on ``all``: every
# partition's consumers read them. The count is fixed for a bus: every service of a cluster
# must use the same one.
PARTITIONS_ENV = "TRAINYARD_PARTITIONS"
DEFAULT_PARTITIONS = 16
MAX_PARTITIONS = 256
ALL_PARTITIONS = "all"
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


def partitions_setting(env: dict[str, str] | None = None) -> int:
    """``$TRAINYARD_PARTITIONS`` (1 to 256); 16 when unset."""
    import os

    raw = (os.environ if env is None else env).get(PARTITIONS_ENV, "").strip() or str(DEFAULT_PARTITIONS)
    try:
        count = int(raw)
    except ValueError:
        raise ValueError(f"${PARTITIONS_ENV}: expected a number of partitions (1 to {MAX_PARTITIONS}), "
                         f"got {raw!r}") from None
    if not 1 <= count <= MAX_PARTITIONS:
        raise ValueError(f"${PARTITIONS_ENV}: must be between 1 and {MAX_PARTITIONS}, got {count}")
    return count


def partition_token(partition: int | None) -> str:
    """``p<N>``, or ``all`` (None) for an object of no TrainJob."""
    return ALL_PARTITIONS if partition is None else f"p{partition}"


def partition_of_subject(subject: str) -> int | None:
    """The partition of an events/plans/results subject (None: ``all``)."""
    token = subject.split(".")[3]
    return None if token == ALL_PARTITIONS else int(token[1:])


def trainjob_partition(namespace: str, name: str, count: int | None = None) -> int:
    """The home partition of the TrainJob ``namespace/name`` (``count``: the setting)."""
    from trainyard.pipeline.trainjobs import partition_of

    return partition_of(namespace, name, count or partitions_setting())


def event_subject(key: ObjectKey, partition: int | None) -> str:
    """``ty.events.<cluster>.<partition>.<kind>.<namespace>.<name>``."""
    return f"{EVENTS_PREFIX}.{encode_token(key.cluster)}.{partition_token(partition)}." \
           f"{encode_token(key.kind)}.{encode_token(key.namespace)}.{encode_token(key.name)}"


def event_filter(cluster: str | None = None, kind: str | None = None, partition: int | None | str = "*") -> str:
    """A filter subject for events of one kind (and cluster, and partition: ``"*"`` any, None
    ``all``), wildcards elsewhere."""
    cluster_token = encode_token(cluster) if cluster is not None else "*"
    kind_token = encode_token(kind) if kind is not None else "*"
    part = "*" if partition == "*" else partition_token(partition)  # type: ignore[arg-type]
    return f"{EVENTS_PREFIX}.{cluster_token}.{part}.{kind_token}.*.*"


def _trainjob_subject(prefix: str, cluster: str, namespace: str, name: str, partition: int | None) -> str:
    if partition is None:
        partition = trainjob_partition(namespace, name)
    return f"{prefix}.{encode_token(cluster)}.p{partition}.TrainJob.{encode_token(namespace)}.{encode_token(name)}"


def plan_subject(cluster: str, namespace: str, name: str, partition: int | None = None) -> str:
    """``ty.desired.<cluster>.p<N>.TrainJob.<namespace>.<name>``: one subject per TrainJob, on
    its home partition (computed from the setting when not given)."""
    return _trainjob_subject(PLANS_PREFIX, cluster, namespace, name, partition)


def result_subject(cluster: str, namespace: str, name: str, partition: int | None = None) -> str:
    """``ty.results.<cluster>.p<N>.TrainJob.<namespace>.<name>``."""
    return _trainjob_subject(RESULTS_PREFIX, cluster, namespace, name, partition)


def partition_filter(prefix: str, cluster: str, partition: int | None) -> str:
    """Everything of one cluster on one partition under ``prefix``."""
    return f"{prefix}.{encode_token(cluster)}.{partition_token(partition)}.>"


def progress_subject(cluster: str, namespace: str, name: str) -> str:
    """``ty.progress.<cluster>.TrainJob.<namespace>.<name>``: one TrainJob's progress reports."""
    return f"{PROGRESS_PREFIX}.{ObjectKey(cluster, 'TrainJob', namespace, name).tokens()}"


def dead_letter_subject(original_subject: str) -> str:
    """``ty.dead.<original subject>``: the poison message's subject kept for triage."""
    return f"{DEAD_LETTER_PREFIX}.{original_subject}"


def key_from_subject(subject: str) -> ObjectKey:
    """The object key of an events/plans/results subject
    (``<prefix>.<cluster>.<partition>.<kind>.<namespace>.<name>``)."""
    tokens = subject.split(".")
    if len(tokens) < 7:
        raise ValueError(f"subject {subject!r} does not end with cluster.partition.kind.namespace.name")
    return ObjectKey.from_tokens(".".join([tokens[-5], *tokens[-3:]]))


def kv_key(key: ObjectKey) -> str:
    """KV key of an object snapshot: ``<cluster>.<kind>.<namespace>.<name>`` (encoded)."""
    return key.tokens()


def kv_prefix(cluster: str, kind: str, namespace: str | None = None) -> str:
    """A KV key filter for all objects of one kind (and namespace)."""
    ns = encode_token(namespace) if namespace is not None else "*"
    return f"{encode_token(cluster)}.{encode_token(kind)}.{ns}.*"
