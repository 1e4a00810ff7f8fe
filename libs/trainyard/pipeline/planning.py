"""``plan()``: TrainJob + runtime + observed objects -> desired objects (spec §4.1.3)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from .defaults import runtime_with_defaults, trainjob_with_defaults
from .documents import as_document, dig
from .errors import PlanningError
from trainyard.compat import DEFAULT_COMPAT, TrainerCompat
from .framework import Plugin, PlanContext, SshKeyFactory, run_planning
from .info import build_info
from .observed import ObservedState
from .plugins import REGISTRY
from trainyard.apimachinery.quantity import QuantityError
from trainyard.api import constants as c
from .resolution import ResolvedRuntime, RuntimeLookupError, SUPPORTED_KEYS, lookup_runtime, \
    registry_key, unsupported_runtime_message
from .curve_keys import CurveKeyFactory, new_curve_key_pair
from .snapshot import RuntimeSnapshot, read_snapshot, snapshot_config_map, snapshot_text
from .ssh_keys import new_ssh_key_pair


@dataclass(frozen=True)
class Plan:
    """The desired objects for one TrainJob, in apply order, and their hash."""

    trainjob: tuple[str, str]  # (namespace, name)
    generation: int | None
    objects: tuple[dict[str, Any], ...]
    hash: str


def canonical_json(objects: Sequence[dict[str, Any]]) -> bytes:
    """Stable bytes for hashing: sorted keys, no whitespace."""
    return json.dumps(list(objects), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def render_yaml(objects: Sequence[dict[str, Any]]) -> str:
    """Multi-document YAML in plan order (keys in document order, no anchors/aliases)."""
    import yaml

    class _PlainDumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    return yaml.dump_all(list(objects), Dumper=_PlainDumper, sort_keys=False, default_flow_style=False,
                         width=120, allow_unicode=True)


def plan_hash(objects: Sequence[dict[str, Any]]) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(objects)).hexdigest()


def resolve(trainjob: dict[str, Any], observed: ObservedState, runtime: Any | None = None) -> ResolvedRuntime:
    """The referenced runtime, defaulted (spec §2); PlanningError with upstream's texts if none.

    ``runtime`` short-cuts the lookup when the caller already holds the runtime.
    """
    message = unsupported_runtime_message(trainjob)
    if message is not None:
        raise PlanningError(message, reason=c.REASON_TRAINING_RUNTIME_NOT_SUPPORTED)
    if runtime is None:
        try:
            runtime = lookup_runtime(trainjob, observed)
        except RuntimeLookupError as err:
            raise err.planning_error() from None
    return ResolvedRuntime(SUPPORTED_KEYS[registry_key(trainjob)], runtime_with_defaults(as_document(runtime)))


def plan(trainjob: Any, runtime: Any | None = None, observed: Iterable[Any] | ObservedState = (),
         *, new_ssh_key: SshKeyFactory = new_ssh_key_pair,
         new_curve_key: CurveKeyFactory = new_curve_key_pair,
         plugins: Sequence[Plugin] = REGISTRY, compat: TrainerCompat = DEFAULT_COMPAT) -> Plan:
    """Plan the objects upstream's controller would apply for ``trainjob``.

    ``runtime`` is the referenced TrainingRuntime / ClusterTrainingRuntime; when None it is
    looked up in ``observed`` the way upstream does (§2.2). ``observed`` holds the cluster
    objects planning reads (existing JobSet, PodGroups, MPI Secret). Raises PlanningError
    with upstream's error text when no objects can be planned. ``compat``: which release's
    behaviour where v2.1.0 and v2.3.0 differ (docs/compatibility.md).
    """
    job = trainjob_with_defaults(as_document(trainjob))
    state = observed if isinstance(observed, ObservedState) else ObservedState.of(observed)
    stored: RuntimeSnapshot | None = None
    if compat.v2_3 and unsupported_runtime_message(job) is None:
        # v2.3.0: the runtime as first planned, whatever became of it since (KEP-2599).
        stored = read_snapshot(job, state)
        if stored is not None:
            runtime = stored.document
        elif runtime is None:
            try:
                runtime = lookup_runtime(job, state)
            except RuntimeLookupError as err:
                raise err.planning_error() from None
    resolved = resolve(job, state, runtime)
    try:
        info = build_info(job, resolved.spec, compat)
        ctx = PlanContext(trainjob=job, runtime=resolved, info=info, observed=state, new_ssh_key=new_ssh_key,
                          new_curve_key=new_curve_key, compat=compat)
        objects = run_planning(plugins, ctx)
    except QuantityError as err:
        raise PlanningError(str(err)) from None
    if compat.v2_3:
        # Written first, in every plan (the same text once stored: applying it again changes
        # nothing), so it is among the objects the TrainJob owns.
        text = stored.text if stored is not None else snapshot_text(as_document(runtime), resolved.kind)
        objects.insert(0, snapshot_config_map(job, text, ctx.owner_reference()))
    generation = dig(job, "metadata", "generation")
    return Plan(
        trainjob=(ctx.namespace, ctx.name),
        generation=generation if isinstance(generation, int) else None,
        objects=tuple(objects),
        hash=plan_hash(objects),
    )
