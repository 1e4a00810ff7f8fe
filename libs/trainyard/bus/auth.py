"""Who may do what on the bus: one NATS user (an NKey) per service and cluster, each allowed
exactly the subjects its code uses (docs/security.md), plus the bootstrap identity that
creates the topology. The server's configuration holds only public keys; each identity's
seed is in its own credentials file (0600), with the CA to trust and its inbox prefix.

Identities: ``<role>-<cluster>`` for watcher, planner, applier and status (one per cluster:
a worker's applier cannot touch another cluster's plans), ``dispatcher`` and ``dashboard``
(the manager's, reading every cluster), and ``bootstrap`` (streams, buckets, consumers: the
whole JetStream API) and ``admin`` (everything: the operator's, for inspecting and repairing
the bus; no service runs with it).
"""
from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainyard.bus import subjects
from trainyard.bus.subjects import (
    DEAD_LETTER_PREFIX, EVENTS_PREFIX, PLANS_PREFIX, PROGRESS_PREFIX, RESULTS_PREFIX, encode_token,
)
from trainyard.bus.topology import (
    APPLIED_BUCKET, CHECKED_BUCKETS, EVENTS_STREAM, FLOOR_KEY, LEASES_BUCKET, MEMBERS_BUCKET, OUTCOMES_BUCKET, PLANS_STREAM,
    PRESENCE_ADVISORIES, PRESENCE_STREAM, PROGRESS_STREAM, RESULTS_STREAM, SLOTS_BUCKET, SNAPSHOTS_BUCKET,
)
from trainyard.roles import CLUSTER_ROLES, MANAGER_ROLES

CREDENTIALS_ENV = "TRAINYARD_NATS_CREDENTIALS"
BOOTSTRAP = "bootstrap"
ADMIN = "admin"  # the operator's (and tests') full access, for inspecting and repairing the bus
BUCKETS = (SNAPSHOTS_BUCKET, APPLIED_BUCKET, OUTCOMES_BUCKET)
API = "$JS.API"


def identity_name(role: str, cluster: str | None = None) -> str:
    return role if cluster is None or role in (*MANAGER_ROLES, BOOTSTRAP, ADMIN) else f"{role}-{cluster}"


def inbox_prefix(identity: str) -> str:
    """Each identity's own inbox subjects: replies to one never reach another."""
    return f"_INBOX_{encode_token(identity)}"


@dataclass(frozen=True)
class Credentials:
    """What a client needs to connect as one identity."""

    user: str
    seed: str  # the NKey seed ("SU..."): the secret
    ca_pem: str = ""  # the CA that signed the server's certificate (TLS), inline
    inbox: str = ""
    topology: bool = False  # may create streams, buckets and consumers (bootstrap)

    @property
    def inbox_prefix(self) -> str:
        return self.inbox or inbox_prefix(self.user)

    @classmethod
    def load(cls, path: str | Path) -> "Credentials":
        raw = json.loads(Path(path).read_text())
        return cls(user=raw["user"], seed=raw["seed"], ca_pem=raw.get("ca", ""), inbox=raw.get("inboxPrefix", ""),
                   topology=bool(raw.get("topology", False)))

    def dump(self) -> str:
        return json.dumps({"user": self.user, "seed": self.seed, "ca": self.ca_pem,
                           "inboxPrefix": self.inbox_prefix, "topology": self.topology}, indent=2) + "\n"

    @property
    def public_key(self) -> str:
        import nkeys

        return nkeys.from_seed(bytearray(self.seed.encode())).public_key.decode()


def from_environment() -> Credentials | None:
    """The credentials named by ``$TRAINYARD_NATS_CREDENTIALS`` (None when unset: an
    unauthenticated bus, as the plain test fixtures run)."""
    path = os.environ.get(CREDENTIALS_ENV, "").strip()
    return Credentials.load(path) if path else None


def new_seed() -> str:
    import nkeys

    return nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER).decode()


# -- permissions ------------------------------------------------------------------------------


@dataclass
class Grants:
    publish: list[str] = field(default_factory=list)
    subscribe: list[str] = field(default_factory=list)

    def as_config(self) -> dict[str, Any]:
        return {"publish": {"allow": sorted(set(self.publish))},
                "subscribe": {"allow": sorted(set(self.subscribe))}}


def _kv_read(grants: Grants, bucket: str, prefix: str) -> None:
    """Get keys under ``prefix`` and list them (a short-lived named consumer, filter bound).

    A batched direct get (``topology.bucket_configs``) names its keys in the request body, and
    so does the stream leader's ``STREAM.MSG.GET`` (a replicated bucket's fallback), so NATS
    cannot bound gets by key: reads are granted per bucket, listings and writes per key prefix."""
    stream = f"KV_{bucket}"
    grants.publish += [
        f"{API}.STREAM.MSG.GET.{stream}",
        f"{API}.DIRECT.GET.{stream}",
        f"{API}.DIRECT.GET.{stream}.>",
        f"{API}.CONSUMER.CREATE.{stream}.*.$KV.{bucket}.{prefix}",
        f"{API}.CONSUMER.MSG.NEXT.{stream}.*",
        f"{API}.CONSUMER.DELETE.{stream}.*",
    ]


def _kv_write(grants: Grants, bucket: str, prefix: str) -> None:
    _kv_read(grants, bucket, prefix)
    grants.publish.append(f"$KV.{bucket}.{prefix}")


def _consumer(grants: Grants, stream: str, durable: str) -> None:
    """Create/update, inspect and pull from one named durable consumer, and ack its messages;
    delete it (an earlier release's file-held one is created again in memory) and read its
    stream's info (a consumer created again checks that its position is in the stream:
    topology.ensure_consumer)."""
    grants.publish += [
        f"{API}.CONSUMER.CREATE.{stream}.{durable}", f"{API}.CONSUMER.CREATE.{stream}.{durable}.>",
        f"{API}.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
        f"{API}.CONSUMER.INFO.{stream}.{durable}", f"{API}.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"{API}.CONSUMER.DELETE.{stream}.{durable}", f"{API}.STREAM.INFO.{stream}",
        f"$JS.ACK.{stream}.{durable}.>",
    ]


def _partitioned(grants: Grants, role: str, cluster: str, streams: list[tuple[str, str]], partitions: int) -> None:
    """A partitioned role (trainyard.bus.partitions): one durable per partition and stream
    (``<name>-p<N>_<cluster>``; NATS cannot wildcard part of a token, so each is named), and
    its own entries of the lease bucket."""
    from trainyard.bus.topology import partition_durable

    for stream, name in streams:
        for partition in range(partitions):
            _consumer(grants, stream, partition_durable(name, cluster, partition))
    keys = f"{encode_token(role)}.{encode_token(cluster)}.>"
    grants.publish.append(f"{API}.STREAM.INFO.KV_{LEASES_BUCKET}")
    _kv_write(grants, LEASES_BUCKET, keys)
    # Presence (trainyard.bus.presence): a consumer on the members stream filtered on its own
    # role's keys, made and deleted; the listing of every presence's name, and their creations
    # and deletions announced. Nothing is written to the members bucket.
    grants.publish += [f"{API}.STREAM.INFO.{PRESENCE_STREAM}", f"{API}.CONSUMER.CREATE.{PRESENCE_STREAM}.*.$KV.{MEMBERS_BUCKET}.{keys}",
                       f"{API}.CONSUMER.DELETE.{PRESENCE_STREAM}.*", f"{API}.CONSUMER.NAMES.{PRESENCE_STREAM}"]
    grants.subscribe += list(PRESENCE_ADVISORIES)


def grants_for(role: str, cluster: str, clusters: list[str] | None = None, partitions: int | None = None) -> Grants:
    """Exactly the subjects ``role``'s code uses for ``cluster`` (``clusters``: every cluster of
    the bus, for the manager's dispatcher and dashboard; ``partitions``: the bus's partition
    count, ``$TRAINYARD_PARTITIONS`` when not given)."""

    partitions = partitions or subjects.partitions_setting()

    token = encode_token(cluster)
    identity = identity_name(role, cluster)
    grants = Grants(subscribe=[f"{inbox_prefix(identity)}.>"])
    if role == BOOTSTRAP:
        # The API, and each replicated data bucket's floor marker (topology.ensure_floor_marker).
        grants.publish += [f"{API}.>", *(f"$KV.{bucket}.{FLOOR_KEY}" for bucket in CHECKED_BUCKETS)]
        return grants
    if role == ADMIN:
        return Grants(publish=[">"], subscribe=[">"])
    # Every session opens the three stores (stream info only: no contents).
    grants.publish += [f"{API}.STREAM.INFO.KV_{bucket}" for bucket in BUCKETS]
    mine = f"{token}.>"
    if role == "watcher":
        grants.publish.append(f"{EVENTS_PREFIX}.{mine}")
        _kv_write(grants, SNAPSHOTS_BUCKET, mine)
        # The roles' backlogs it exports for autoscalers (trainyard.bus.backlog): one listing of
        # each stream's consumers, read-only.
        grants.publish += [f"{API}.CONSUMER.LIST.{stream}" for stream in (EVENTS_STREAM, PLANS_STREAM, RESULTS_STREAM)]
    elif role == "planner":
        _partitioned(grants, role, cluster, [(EVENTS_STREAM, "planner")], partitions)
        grants.publish += [f"{PLANS_PREFIX}.{mine}", f"{RESULTS_PREFIX}.{mine}",
                           f"{DEAD_LETTER_PREFIX}.{EVENTS_PREFIX}.{mine}"]
        _kv_read(grants, SNAPSHOTS_BUCKET, mine)
        _kv_write(grants, APPLIED_BUCKET, mine)  # forgets a deleted TrainJob's entry
        _kv_write(grants, OUTCOMES_BUCKET, mine)  # planning errors
    elif role == "applier":
        _partitioned(grants, role, cluster, [(PLANS_STREAM, "applier")], partitions)
        grants.publish += [f"{RESULTS_PREFIX}.{mine}", f"{DEAD_LETTER_PREFIX}.{PLANS_PREFIX}.{mine}"]
        _kv_read(grants, SNAPSHOTS_BUCKET, mine)
        _kv_write(grants, APPLIED_BUCKET, mine)  # claims and applied plans (compare-and-set)
        _kv_write(grants, OUTCOMES_BUCKET, mine)  # apply errors
    elif role == "status":
        _partitioned(grants, role, cluster, [(EVENTS_STREAM, "status"), (RESULTS_STREAM, "status-results")],
                     partitions)
        grants.publish += [f"{DEAD_LETTER_PREFIX}.{EVENTS_PREFIX}.{mine}", f"{DEAD_LETTER_PREFIX}.{RESULTS_PREFIX}.{mine}",
                           f"{PROGRESS_PREFIX}.{mine}"]  # the trainers' progress reports it accepted
        for bucket in BUCKETS:
            _kv_read(grants, bucket, mine)
    elif role == "dispatcher":
        # TrainJob events of every cluster (the manager's own and the worker copies'), through
        # its partitions' consumers dispatcher-p<N>_<its --cluster> (any of the bus's cluster
        # names), and its leases.
        for own in dict.fromkeys([cluster, *(clusters or [])]):
            _partitioned(grants, role, own, [(EVENTS_STREAM, "dispatcher")], partitions)
        grants.publish.append(f"{DEAD_LETTER_PREFIX}.{EVENTS_PREFIX}.*.*.{encode_token('TrainJob')}.>")
        # The worker slots its manager's TrainJobs hold (entries <its --cluster>.<worker>).
        grants.publish.append(f"{API}.STREAM.INFO.KV_{SLOTS_BUCKET}")
        _kv_write(grants, SLOTS_BUCKET, mine)
    elif role == "dashboard":
        for other in clusters or [cluster]:
            other_token = encode_token(other)
            grants.subscribe += [f"{prefix}.{other_token}.>" for prefix in (EVENTS_PREFIX, PLANS_PREFIX, RESULTS_PREFIX)]
            _kv_read(grants, SNAPSHOTS_BUCKET, f"{other_token}.>")
            # Progress reports: new ones as they come, a TrainJob's history through a
            # short-lived consumer whose filter the grant binds to this cluster.
            grants.subscribe.append(f"{PROGRESS_PREFIX}.{other_token}.>")
            grants.publish.append(f"{API}.CONSUMER.CREATE.{PROGRESS_STREAM}.*.{PROGRESS_PREFIX}.{other_token}.>")
        # Backlogs: one listing of each stream's consumers (every partition's at once).
        grants.publish += [f"{API}.CONSUMER.LIST.{stream}" for stream in (EVENTS_STREAM, PLANS_STREAM, RESULTS_STREAM)]
        grants.publish += [f"{API}.CONSUMER.MSG.NEXT.{PROGRESS_STREAM}.*", f"{API}.CONSUMER.DELETE.{PROGRESS_STREAM}.*"]
    else:
        raise ValueError(f"unknown bus role {role!r}")
    return grants


# -- the server's configuration and the credential files --------------------------------------


@dataclass(frozen=True)
class BusSecurity:
    """The files ``trainyard up`` (or an installer) generates: the server's config include and
    one credentials file per identity."""

    directory: Path
    server_config: Path
    credentials: dict[str, Path]

    def credentials_for(self, role: str, cluster: str | None = None) -> Path:
        return self.credentials[identity_name(role, cluster)]


def _conf_value(value: Any) -> str:
    """nats-server's config syntax accepts JSON values."""
    return json.dumps(value)


def server_config(users: list[tuple[str, str, Grants]], tls: tuple[Path | str, Path | str] | None) -> str:
    """An include for nats-server: ``authorization`` with one NKey user per identity (public
    keys only) and, with ``tls`` (certificate chain, key), TLS on the client port."""
    lines = ["# Generated by trainyard (docs/security.md): one NKey user per identity, least privilege.",
             "authorization {", "  users = ["]
    for name, public_key, grants in users:
        lines.append(f"    # {name}")
        lines.append(f"    {{nkey: {_conf_value(public_key)}, permissions: {_conf_value(grants.as_config())}}}")
    lines += ["  ]", "}"]
    if tls is not None:
        cert, key = tls
        lines += ["tls {", f"  cert_file: {_conf_value(str(cert))}", f"  key_file: {_conf_value(str(key))}",
                  "  timeout: 5", "}"]
    return "\n".join(lines) + "\n"


def identities(clusters: list[str], manager: str | None = None) -> list[tuple[str, str]]:
    """(role, cluster) of every identity of a bus shared by ``clusters`` (the first is the manager)."""
    manager = manager or clusters[0]
    wanted: list[tuple[str, str]] = [(BOOTSTRAP, manager), (ADMIN, manager)]
    wanted += [(role, cluster) for cluster in clusters for role in CLUSTER_ROLES]
    wanted += [(role, manager) for role in MANAGER_ROLES]
    return wanted


def generate(directory: Path, clusters: list[str], *, manager: str | None = None,
             tls_hosts: list[str] | None = None, server_tls_dir: str | None = None) -> BusSecurity:
    """Creates (or keeps) the CA and server certificate, one seed per identity, and the server
    config, all 0600 in ``directory``. Seeds already there are kept (a restarted stack keeps
    its identities); the config is rewritten (clusters may have changed)."""
    from trainyard.security import pki

    for private_dir in (directory, directory / "credentials", directory / "tls"):
        private_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(private_dir, 0o700)
    manager = manager or clusters[0]
    bundle, _ = pki.ensure_bundle(directory / "tls", tls_hosts or ["127.0.0.1", "localhost"],
                                  ca_common_name="trainyard-nats-ca")
    wanted = identities(clusters, manager)
    users: list[tuple[str, str, Grants]] = []
    files: dict[str, Path] = {}
    for role, cluster in wanted:
        name = identity_name(role, cluster)
        path = directory / "credentials" / f"{name}.json"
        seed = ""
        if path.is_file():
            try:
                seed = Credentials.load(path).seed
            except (OSError, ValueError, KeyError):
                seed = ""
        creds = Credentials(user=name, seed=seed or new_seed(), ca_pem=bundle.ca_bundle_pem.decode(),
                            topology=role in (BOOTSTRAP, ADMIN))
        pki.write_private(path, creds.dump().encode())
        files[name] = path
        users.append((name, creds.public_key, grants_for(role, cluster, clusters)))
    config = directory / "nats-auth.conf"
    # ``server_tls_dir``: where nats-server will find tls.crt and tls.key (e.g. a mounted Secret).
    tls_dir = server_tls_dir or str(directory / "tls")
    pki.write_private(config, server_config(users, (f"{tls_dir}/tls.crt", f"{tls_dir}/tls.key")).encode())
    return BusSecurity(directory, config, files)


__all__ = ["BOOTSTRAP", "BusSecurity", "CREDENTIALS_ENV", "Credentials", "Grants", "from_environment",
           "generate", "grants_for", "identity_name", "inbox_prefix", "server_config", "subjects"]
