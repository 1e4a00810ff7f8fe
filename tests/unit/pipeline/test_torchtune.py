"""TorchTune mode: model names, recipe/config selection, command mutation, checks (spec §4.3)."""
from __future__ import annotations

from typing import Any

import pytest

from fixtures.pipeline_builders import (container, container_of, default_jobs, env_of, find, job, parallelism,
                                        torch_runtime, trainjob)
from trainyard.pipeline import plan, validate_trainjob
from trainyard.pipeline.plugins.torchtune import model_of, recipe_and_config

WS = "/" + "workspace"
RUNTIME_COMMAND = ["tune", "run", "--rdzv_endpoint=localhost:29500", "full_finetune_distributed", "--config",
                   "llama3_2/1B_full", "dataset=torchtune.datasets.instruct_dataset", "dataset.source=parquet",
                   f"dataset.data_dir={WS}/dataset/data", f"output_dir={WS}/output",
                   f"tokenizer.path={WS}/model/original/tokenizer.model", f"checkpointer.checkpoint_dir={WS}/model"]
KEPT = [f"output_dir={WS}/output", f"tokenizer.path={WS}/model/original/tokenizer.model",
        f"checkpointer.checkpoint_dir={WS}/model"]
LORA = ["model.lora_attn_modules=[q_proj,v_proj]"]


@pytest.mark.parametrize("name, model", [
    ("torchtune-llama3.2-1b", "llama3_2/1B"), ("torchtune-llama3.2-3b", "llama3_2/3B"),
    ("torchtune-llama3.3-70b", "llama3_3/70B"), ("torchtune-qwen2.5-1.5b", "qwen2_5/1.5B"),
    ("torchtune-llama3.1-70b", "llama3_1/70B"), ("my-torchtune", ""), ("a-b-c-d", ""),
])
def test_model_from_runtime_name(name: str, model: str) -> None:
    assert model_of(name) == model


@pytest.mark.parametrize("nodes, nproc, gpus, args, expected", [
    (1, 1, 0, ["model.quantize_base=True"], ("lora_finetune_single_device", "m_qlora_single_device")),
    (1, "auto", 1, LORA, ("lora_finetune_single_device", "m_lora_single_device")),
    (1, 1, 0, [], ("full_finetune_single_device", "m_full_single_device")),
    (1, "auto", 2, ["model.quantize_base=True"], ("lora_finetune_distributed", "m_qlora")),
    (1, "auto", 2, LORA, ("lora_finetune_distributed", "m_lora")),
    # v2.3.0 reads these as booleans: use_dora=False does not turn QLoRA off (v2.1.0: it did),
    # use_dora=True does, and quantize_base=False is not QLoRA.
    (1, "auto", 2, [*LORA, "model.quantize_base=True", "model.use_dora=False"], ("lora_finetune_distributed", "m_qlora")),
    (1, "auto", 2, [*LORA, "model.quantize_base=True", "model.use_dora=True"], ("lora_finetune_distributed", "m_lora")),
    (1, "auto", 2, [*LORA, "model.quantize_base=False"], ("lora_finetune_distributed", "m_lora")),
    (2, "auto", 2, LORA, ("full_finetune_distributed", "m_full_multinode")),
    (1, "auto", 2, [], ("full_finetune_distributed", "m_full")),
    (0, 1, 1, [], ("full_finetune_distributed", "m_full")),
])
def test_recipe_and_config_selection(nodes: int, nproc: Any, gpus: int, args: list[str],
                                     expected: tuple[str, str]) -> None:
    assert recipe_and_config("m", nodes, nproc, gpus, args) == expected


def tune_runtime(name: str = "torchtune-llama3.2-1b", num_nodes: int = 1) -> dict[str, Any]:
    jobs = default_jobs()
    jobs[2] = job("node", container("node", command=list(RUNTIME_COMMAND),
                                    resources={"limits": {"nvidia.com/gpu": 2}}), ancestor="trainer")
    return torch_runtime(jobs, num_nodes=num_nodes, name=name, kind="ClusterTrainingRuntime")


def tune_plan(runtime_name: str, **trainer: Any) -> dict[str, Any]:
    runtime = tune_runtime(runtime_name)
    job_doc = trainjob(runtime_name=runtime_name, runtime_kind="ClusterTrainingRuntime",
                       trainer={"command": ["tune", "run"], **trainer})
    return find(plan(job_doc, runtime).objects, "JobSet")


@pytest.mark.parametrize("trainer, command", [
    pytest.param({"numNodes": 1, "numProcPerNode": "auto", "resourcesPerNode": {"limits": {"example.com/gpu": 2}},
                  "args": LORA},
                 ["--rdzv_endpoint=test-job-node-0-0.test-job:29500", "lora_finetune_distributed", "--config",
                  "llama3_2/1B_lora"], id="lora-two-gpus"),
    pytest.param({"numNodes": 1, "resourcesPerNode": {"limits": {"example.com/gpu": 1}},
                  "args": [*LORA, "model.quantize_base=True"]},
                 ["lora_finetune_single_device", "--config", "llama3_2/1B_qlora_single_device"], id="qlora-one-gpu"),
    pytest.param({"numNodes": 1, "resourcesPerNode": {"limits": {"example.com/gpu": 2}},
                  "args": [*LORA, "model.quantize_base=True", "model.use_dora=True"]},
                 ["--rdzv_endpoint=test-job-node-0-0.test-job:29500", "lora_finetune_distributed", "--config",
                  "llama3_2/1B_lora"], id="dora-is-lora"),
    pytest.param({"numNodes": 1, "numProcPerNode": 1},
                 ["full_finetune_single_device", "--config", "llama3_2/1B_full_single_device"], id="single-full"),
])
def test_command_mutation(trainer: dict[str, Any], command: list[str]) -> None:
    jobset = tune_plan("torchtune-llama3.2-1b", **trainer)
    node = container_of(jobset, "node")
    assert node["command"] == ["tune", "run", *command, *KEPT]
    assert node.get("args") == trainer.get("args")


def test_multinode_70b_keeps_runtime_config_keys_and_no_master_env() -> None:
    jobset = tune_plan("torchtune-llama3.3-70b", numNodes=30, numProcPerNode=3, args=["dtype=fp16"])
    node = container_of(jobset, "node")
    assert parallelism(jobset, "node") == 30
    assert node["command"] == ["tune", "run", "--rdzv_endpoint=test-job-node-0-0.test-job:29500",
                               "full_finetune_distributed", "--config", "llama3_3/70B_full_multinode", *KEPT]
    env = env_of(node)
    assert set(env) == {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK"}
    assert (env["PET_NNODES"], env["PET_NPROC_PER_NODE"]) == ("30", "3")
    assert node["ports"] == [{"containerPort": 29500}]


def test_gpu_auto_kept_in_torchtune_env() -> None:
    env = env_of(container_of(tune_plan("torchtune-llama3.2-1b", numNodes=1,
                                        resourcesPerNode={"limits": {"nvidia.com/gpu": 4}}), "node"))
    assert env["PET_NPROC_PER_NODE"] == "auto" and "PET_MASTER_ADDR" not in env


def test_runtime_tune_command_kept_when_trainjob_sets_no_command() -> None:
    runtime = tune_runtime()
    job_doc = trainjob(runtime_name="torchtune-llama3.2-1b", runtime_kind="ClusterTrainingRuntime",
                       trainer={"numNodes": 1})
    node = container_of(find(plan(job_doc, runtime).objects, "JobSet"), "node")
    assert node["command"] == RUNTIME_COMMAND
    assert env_of(node)["PET_MASTER_ADDR"] == "test-job-node-0-0.test-job"


@pytest.mark.parametrize("runtime_name, trainer, expected", [
    pytest.param("torchtune-llama3.1-70b", {"numNodes": 1, "numProcPerNode": "auto"},
                 ['spec.runtimeRef.name: Invalid value: "torchtune-llama3.1-70b": must have a supported pretrained '
                  "model, invalid model configured: llama3_1/70B"], id="unsupported-model"),
    pytest.param("torchtune-llama3.2-3b", {"numNodes": 2, "numProcPerNode": "auto"},
                 ["spec.trainer.numNodes: Invalid value: 2: must be 1 for llama3_2/3B model"], id="multinode-3b"),
    pytest.param("torchtune-llama3.3-70b", {"numNodes": 2, "numProcPerNode": "auto"}, [], id="multinode-70b-ok"),
    pytest.param("torchtune-qwen2.5-1.5b", {"numNodes": 1, "numProcPerNode": "auto",
                                             "args": [*LORA, "model.quantize_base=True"]},
                 ['spec.runtimeRef.name: Invalid value: "torchtune-qwen2.5-1.5b": QLoRA is not supported for '
                  "qwen2_5/1.5B model"], id="qlora-qwen"),
    pytest.param("torchtune-llama3.2-1b", {"numNodes": 1, "numProcPerNode": "auto",
                                            "resourcesPerNode": {"limits": {"example.com/gpu": 2}},
                                            "args": [*LORA, "model.quantize_base=True"]},
                 ['spec.trainer.numProcPerNode: Invalid value: "auto": must be auto or 1 for llama3_2/1B model when '
                  "using QLoRA",
                  'spec.trainer.resourcesPerNode: Invalid value: {"limits":{"example.com/gpu":2}}: must have gpu '
                  "resource with value 1 for llama3_2/1B model when using QLoRA"], id="distributed-qlora-1b"),
    pytest.param("torchtune-llama3.2-1b", {"numProcPerNode": "auto"}, [], id="unset-numnodes-uses-runtime-value"),
    pytest.param("torchtune-llama3.2-1b", {"numNodes": 1}, [], id="no-nproc-no-checks"),
])
def test_torchtune_admission(runtime_name: str, trainer: dict[str, Any], expected: list[str]) -> None:
    job_doc = trainjob(runtime_name=runtime_name, runtime_kind="ClusterTrainingRuntime",
                       trainer={"command": ["tune", "run"], **trainer})
    result = validate_trainjob(job_doc, runtime=tune_runtime(runtime_name))
    assert result.texts() == expected
