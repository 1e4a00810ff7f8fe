"""The plugin framework: extension points, contexts, and the fixed run order (spec §3).

A plugin is one module exposing ``PLUGIN = Plugin(name=..., <phase>=function, ...)``; it
fills in only the phases it implements. ``plugins.REGISTRY`` lists them once, and that
order is the order inside every phase (upstream's is random; ours is fixed).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from opentelemetry import trace

from trainyard.telemetry import detail

from .documents import dig, mapping
from trainyard.compat import DEFAULT_COMPAT, TrainerCompat
from trainyard.api import constants as c
from .curve_keys import CurveKeyFactory, new_curve_key_pair
from .errors import FieldError
from .info import RuntimeInfo
from .observed import ObservedState
from .resolution import ResolvedRuntime

SshKeyFactory = Callable[[], tuple[bytes, bytes]]

_tracer = trace.get_tracer("trainyard.pipeline")


@dataclass
class PlanContext:
    """What a planning phase sees: the TrainJob, the runtime, the info, the cluster state."""

    trainjob: dict[str, Any]
    runtime: ResolvedRuntime
    info: RuntimeInfo
    observed: ObservedState
    new_ssh_key: SshKeyFactory
    new_curve_key: CurveKeyFactory = new_curve_key_pair  # the Flux CURVE certificate's key pair
    compat: TrainerCompat = DEFAULT_COMPAT  # which release's behaviour where v2.1.0 and v2.3.0 differ
    # Read once from the TrainJob (plugins ask for them many times).
    name: str = field(init=False)
    namespace: str = field(init=False)
    spec: dict[str, Any] = field(init=False)
    trainer: dict[str, Any] | None = field(init=False)

    def __post_init__(self) -> None:
        self.name = str(dig(self.trainjob, "metadata", "name") or "")
        self.namespace = str(dig(self.trainjob, "metadata", "namespace") or "")
        self.spec = mapping(self.trainjob.get("spec"))
        trainer = self.spec.get("trainer")
        self.trainer = trainer if isinstance(trainer, dict) else None

    def owner_reference(self) -> dict[str, Any]:
        meta = mapping(self.trainjob.get("metadata"))
        reference: dict[str, Any] = {
            "apiVersion": str(self.trainjob.get("apiVersion") or c.TRAINER_API_VERSION),
            "kind": c.TRAIN_JOB_KIND,
            "name": self.name,
        }
        # A TrainJob read from a file has no uid yet; the reference then carries none.
        if meta.get("uid"):
            reference["uid"] = str(meta["uid"])
        reference["controller"] = True
        reference["blockOwnerDeletion"] = True
        return reference


@dataclass
class ValidationContext:
    """What a CustomValidation plugin sees (admission: new and, on update, old TrainJob)."""

    trainjob: dict[str, Any]
    old: dict[str, Any] | None
    runtime: ResolvedRuntime
    info: RuntimeInfo | None
    observed: ObservedState
    compat: TrainerCompat = DEFAULT_COMPAT

    @property
    def spec(self) -> dict[str, Any]:
        return mapping(self.trainjob.get("spec"))

    @property
    def trainer(self) -> dict[str, Any] | None:
        trainer = self.spec.get("trainer")
        return trainer if isinstance(trainer, dict) else None


@dataclass
class Verdict:
    warnings: list[str] = field(default_factory=list)
    errors: list[FieldError] = field(default_factory=list)


Phase = Callable[[PlanContext], None]
Builder = Callable[[PlanContext], list[dict[str, Any]]]
Validator = Callable[[ValidationContext], Verdict]


@dataclass(frozen=True)
class ChildKind:
    """An object a plugin makes for a TrainJob, owned by it: the object's apiVersion and kind,
    and its name, the TrainJob's name followed by ``suffix``."""
    api_version: str
    kind: str
    suffix: str = ""

    def name_for(self, trainjob_name: str) -> str:
        return trainjob_name + self.suffix


@dataclass(frozen=True)
class Plugin:
    name: str
    enforce_ml_policy: Phase | None = None
    enforce_pod_group_policy: Phase | None = None
    identify_pod_network: Phase | None = None
    build: Builder | None = None
    validate: Validator | None = None
    # The objects its builder makes: what a TrainJob may own is derived from these (the
    # planner's reads, its event lanes, the watcher's watches).
    children: tuple[ChildKind, ...] = ()


def child_kinds(plugins: Sequence[Plugin]) -> tuple[ChildKind, ...]:
    """Every plugin's children, each once, in plugin order."""
    return tuple(dict.fromkeys(child for plugin in plugins for child in plugin.children))


PLANNING_PHASES = ("enforce_ml_policy", "enforce_pod_group_policy", "identify_pod_network")


def run_planning(plugins: Sequence[Plugin], ctx: PlanContext) -> list[dict[str, Any]]:
    """Enforce phases in order, then builders; the concatenated outputs in plugin order."""
    for phase in PLANNING_PHASES:
        with detail.span(_tracer.start_as_current_span, f"phase {phase}"):
            for plugin in plugins:
                step = getattr(plugin, phase)
                if step is not None:
                    with detail.span(_tracer.start_as_current_span, f"{plugin.name} {phase}",
                                     attributes={"trainyard.plugin": plugin.name}):
                        step(ctx)
    objects: list[dict[str, Any]] = []
    with detail.span(_tracer.start_as_current_span, "phase build"):
        for plugin in plugins:
            if plugin.build is not None:
                with detail.span(_tracer.start_as_current_span, f"{plugin.name} build",
                                 attributes={"trainyard.plugin": plugin.name}) as span:
                    built = plugin.build(ctx)
                    span.set_attribute("trainyard.objects", len(built))
                    objects.extend(built)
    return objects


def run_validation(plugins: Sequence[Plugin], ctx: ValidationContext) -> Verdict:
    verdict = Verdict()
    for plugin in plugins:
        if plugin.validate is not None:
            result = plugin.validate(ctx)
            verdict.warnings.extend(result.warnings)
            verdict.errors.extend(result.errors)
    return verdict
