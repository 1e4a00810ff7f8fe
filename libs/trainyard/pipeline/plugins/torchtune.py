"""TorchTune mode of the Torch plugin (spec §4.3): model, recipe, config, command, checks."""
from __future__ import annotations

from trainyard.api import constants as c

from typing import TYPE_CHECKING, Any

from ..documents import dig, items
from ..errors import FieldError, invalid
from ..resources import gpu_count
from .shared import effective_resources_per_node, is_int, master_address

if TYPE_CHECKING:
    from ..framework import PlanContext, ValidationContext

_LORA_MARKER = c.TORCHTUNE_ARG_LORA
_QLORA_MARKER = c.TORCHTUNE_ARG_QLORA
_DORA_MARKER = c.TORCHTUNE_ARG_DORA
_MULTI_NODE_MODEL = "llama3_3/70B"
_QWEN = "qwen2_5/1.5B"
_LLAMA_SMALL = ("llama3_2/1B", "llama3_2/3B")


def is_torchtune(trainer: dict[str, Any] | None) -> bool:
    """Exactly ``command: ["tune", "run"]`` switches TorchTune mode on."""
    return isinstance(trainer, dict) and trainer.get("command") == list(c.TORCHTUNE_ENTRYPOINT)


def model_of(runtime_name: str) -> str:
    """``torchtune-llama3.2-1b`` -> ``llama3_2/1B``; not three dash-separated parts -> ''."""
    parts = runtime_name.split("-")
    if len(parts) != 3:
        return ""
    return f"{parts[1].replace('.', '_')}/{parts[2].upper()}"


def _uses_lora(args: list[Any]) -> bool:
    return any(_LORA_MARKER in str(a) for a in args)


def _bool_arg_enabled(args: list[Any], config_item: str) -> bool:
    """v2.3.0: a ``key=value`` argument whose key names the item and whose value is true
    (``model.quantize_base=False`` no longer counts, as it did in v2.1.0)."""
    for arg in args:
        key, sep, value = str(arg).partition("=")
        if sep and config_item in key and value.strip().lower() == "true":
            return True
    return False


def _uses_qlora(args: list[Any]) -> bool:
    return not _bool_arg_enabled(args, _DORA_MARKER) and _bool_arg_enabled(args, _QLORA_MARKER)


def recipe_and_config(model: str, num_nodes: int, nproc: int | str, gpus: int, args: list[Any]) -> tuple[str, str]:
    """First matching row of the selection table (§4.3.4)."""
    single = num_nodes == 1 and (nproc == 1 or gpus == 1)
    qlora, lora = _uses_qlora(args), _uses_lora(args)
    if single and qlora:
        recipe, suffix = c.TORCHTUNE_RECIPE_LORA_SINGLE_DEVICE, c.TORCHTUNE_CONFIG_SUFFIX_QLORA_SINGLE_DEVICE
    elif single and lora:
        recipe, suffix = c.TORCHTUNE_RECIPE_LORA_SINGLE_DEVICE, c.TORCHTUNE_CONFIG_SUFFIX_LORA_SINGLE_DEVICE
    elif single:
        recipe, suffix = c.TORCHTUNE_RECIPE_FULL_SINGLE_DEVICE, c.TORCHTUNE_CONFIG_SUFFIX_FULL_SINGLE_DEVICE
    elif num_nodes == 1 and qlora:
        recipe, suffix = c.TORCHTUNE_RECIPE_LORA_DISTRIBUTED, c.TORCHTUNE_CONFIG_SUFFIX_QLORA
    elif num_nodes == 1 and lora:
        recipe, suffix = c.TORCHTUNE_RECIPE_LORA_DISTRIBUTED, c.TORCHTUNE_CONFIG_SUFFIX_LORA
    elif num_nodes > 1:
        recipe, suffix = c.TORCHTUNE_RECIPE_FULL_DISTRIBUTED, c.TORCHTUNE_CONFIG_SUFFIX_FULL_MULTINODE
    else:
        recipe, suffix = c.TORCHTUNE_RECIPE_FULL_DISTRIBUTED, c.TORCHTUNE_CONFIG_SUFFIX_FULL
    return recipe, f"{model}{suffix}"


def _needs_rendezvous(num_nodes: int, nproc: int | str, gpus: int) -> bool:
    if num_nodes > 1:
        return True
    if isinstance(nproc, int):
        return nproc > 1
    return gpus > 1


def mutated_command(ctx: "PlanContext", num_nodes: int, nproc: int | str,
                    resources: dict[str, Any] | None) -> list[str]:
    trainer = ctx.trainer or {}
    args = items(trainer.get("args"))
    gpus = gpu_count(resources)
    command = list(c.TORCHTUNE_ENTRYPOINT)
    if _needs_rendezvous(num_nodes, nproc, gpus):
        command.append(f"{c.TORCHTUNE_RDZV_ENDPOINT_FLAG}={master_address(ctx.name)}:{c.CONTAINER_TRAINER_PORT}")
    recipe, config = recipe_and_config(model_of(_runtime_ref_name(ctx.trainjob)), num_nodes, nproc, gpus, args)
    command += [recipe, c.TORCHTUNE_CONFIG_FLAG, config]
    for pod_set in ctx.info.pod_sets:
        if pod_set.ancestor != c.ANCESTOR_TRAINER:
            continue
        container = pod_set.container(c.NODE)
        for element in items((container or {}).get("command")):
            if str(element).split("=", 1)[0] in c.TORCHTUNE_COPIED_CONFIG_KEYS:
                command.append(element)
    return command


def _runtime_ref_name(trainjob: dict[str, Any]) -> str:
    return str(dig(trainjob, "spec", "runtimeRef", "name") or "")


def validate(ctx: "ValidationContext") -> list[FieldError]:
    trainer = ctx.trainer or {}
    name = _runtime_ref_name(ctx.trainjob)
    model = model_of(name)
    num_nodes = trainer.get("numNodes")
    if not is_int(num_nodes):
        # Deviation (docs/compatibility.md): upstream dereferences an unset numNodes and the
        # request crashes; we validate with the node count planning would use.
        runtime_nodes = (ctx.info.ml_policy or {}).get("numNodes") if ctx.info else None
        num_nodes = runtime_nodes if is_int(runtime_nodes) else c.DEFAULT_NUM_NODES
    raw = trainer.get("numProcPerNode")
    if raw is None:
        raw = "auto"  # v2.3.0 validates without numProcPerNode too, as auto
    gpus = gpu_count(effective_resources_per_node(ctx.trainjob, ctx.info) if ctx.info else None)
    nproc: int | str = int(raw) if is_int(raw) else str(raw)
    args = items(trainer.get("args"))
    _, config = recipe_and_config(model, num_nodes, nproc, gpus, args)
    errors: list[FieldError] = []
    if model not in c.TORCHTUNE_SUPPORTED_MODELS:
        errors.append(invalid("spec.runtimeRef.name", name,
                              f"{c.ERR_TORCHTUNE_UNSUPPORTED_MODEL}{model}"))
    if num_nodes > 1 and model != _MULTI_NODE_MODEL:
        errors.append(invalid("spec.trainer.numNodes", num_nodes, f"must be 1 for {model} model"))
    if "_qlora" in config and model == _QWEN:
        errors.append(invalid("spec.runtimeRef.name", name, f"QLoRA is not supported for {model} model"))
    if "_qlora" in config and "_qlora_single_device" not in config and model in _LLAMA_SMALL:
        errors.append(invalid("spec.trainer.numProcPerNode", raw,
                              f"must be auto or 1 for {model} model when using QLoRA"))
        errors.append(invalid("spec.trainer.resourcesPerNode", trainer.get("resourcesPerNode"),
                              f"must have gpu resource with value 1 for {model} model when using QLoRA"))
    # v2.3.0: LoRA/QLoRA would silently fall back to a full fine-tune on several nodes.
    if num_nodes > 1 and (_uses_lora(args) or _uses_qlora(args)):
        errors.append(invalid("spec.trainer.numNodes", num_nodes,
                              "LoRA fine-tuning is not supported for multi-node training in TorchTune"))
    # v2.3.0: the configs the runtime injects may not be overridden.
    for index, arg in enumerate(args):
        key = str(arg).split("=", 1)[0]
        if key in c.TORCHTUNE_COPIED_CONFIG_KEYS:
            errors.append(invalid(f"spec.trainer.args[{index}]", arg,
                                  f'must not set immutable config "{key}" in trainer args; it is managed by the runtime'))
    return errors
