"""Planning throughput: plans/s and p50/p99 latency per plan, single process (one core).

    .venv/bin/python bench/plan.py [--seconds 2]

Scenarios: torch 2 nodes; torch 64 nodes with podTemplateOverrides; MPI 8 nodes reusing the
SSH Secret; TorchTune with both initializers; CoScheduling. Target (issue 4): >= 2,000
plans/s for torch 2 nodes, p99 < 2 ms. Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import yaml

from trainyard.pipeline import ObservedState, plan

RUNTIMES = Path(__file__).resolve().parents[1] / "deploy" / "runtimes"


def load_runtime(name: str) -> dict[str, Any]:
    return yaml.safe_load((RUNTIMES / f"{name}.yaml").read_text())


def trainjob(runtime: str, trainer: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "bench", "namespace": "default", "uid": "6f1c1e0a-0000-4000-8000-000000000001"},
            "spec": {"runtimeRef": {"name": runtime}, "trainer": trainer, **spec}}


def scenarios() -> dict[str, Callable[[], Any]]:
    torch = load_runtime("torch-distributed")
    torch_two = trainjob("torch-distributed", {"numNodes": 2, "image": "me/mnist:1", "command": ["torchrun", "t.py"],
                                               "resourcesPerNode": {"limits": {"nvidia.com/gpu": 2}},
                                               "env": [{"name": "EPOCHS", "value": "3"}]})
    overrides = [{"targetJobs": [{"name": "node"}], "metadata": {"labels": {"team": "a"}},
                  "spec": {"nodeSelector": {"pool": "gpu"}, "serviceAccountName": "trainer",
                           "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
                           "volumes": [{"name": "scratch", "emptyDir": {}}]}}]
    torch_64 = trainjob("torch-distributed", {"numNodes": 64, "resourcesPerNode": {"limits": {"nvidia.com/gpu": 8}}},
                        podTemplateOverrides=overrides)
    deepspeed = load_runtime("deepspeed-distributed")
    mpi_8 = trainjob("deepspeed-distributed", {"numNodes": 8, "image": "me/ds:1", "command": ["mpirun", "train.py"],
                                               "resourcesPerNode": {"limits": {"nvidia.com/gpu": 4}}})
    mpi_observed = ObservedState.of([{"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/ssh-auth",
                                      "metadata": {"name": "bench-mpi-ssh-auth", "namespace": "default"}}])
    tune = load_runtime("torchtune-llama3.2-1b")
    tune_job = trainjob("torchtune-llama3.2-1b",
                        {"numNodes": 1, "command": ["tune", "run"], "args": ["model.lora_attn_modules=[q_proj]"],
                         "resourcesPerNode": {"limits": {"nvidia.com/gpu": 2}}},
                        initializer={"dataset": {"storageUri": "hf://tatsu-lab/alpaca"},
                                     "model": {"storageUri": "hf://meta-llama/Llama-3.2-1B-Instruct",
                                               "secretRef": {"name": "hf"}}})
    gang = copy.deepcopy(torch)
    gang["spec"]["podGroupPolicy"] = {"coscheduling": {"scheduleTimeoutSeconds": 120}}
    gang["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0][
        "resources"] = {"requests": {"cpu": "8", "memory": "32Gi"}}
    gang_job = trainjob("torch-distributed", {"numNodes": 4})
    empty = ObservedState()
    return {
        "torch 2 nodes": lambda: plan(torch_two, torch, empty),
        "torch 64 nodes + podTemplateOverrides": lambda: plan(torch_64, torch, empty),
        "MPI 8 nodes (SSH secret reused)": lambda: plan(mpi_8, deepspeed, mpi_observed),
        "torchtune + both initializers": lambda: plan(tune_job, tune, empty),
        "coscheduling 4 nodes": lambda: plan(gang_job, gang, empty),
    }


def measure(run: Callable[[], Any], seconds: float) -> tuple[float, float, float, float, float, int]:
    for _ in range(200):  # warm caches (strategic-merge schemas, imports)
        run()
    samples: list[int] = []
    cpu_samples: list[int] = []
    deadline = time.perf_counter() + seconds
    started = time.perf_counter()
    cpu_started = time.process_time()
    while time.perf_counter() < deadline:
        begin, cpu_begin = time.perf_counter_ns(), time.thread_time_ns()
        run()
        samples.append(time.perf_counter_ns() - begin)
        cpu_samples.append(time.thread_time_ns() - cpu_begin)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    samples.sort()
    cpu_samples.sort()
    p50 = statistics.median(samples) / 1000
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))] / 1000
    cpu_p99 = cpu_samples[min(len(cpu_samples) - 1, int(len(cpu_samples) * 0.99))] / 1000
    return len(samples) / elapsed, len(samples) / cpu, p50, p99, cpu_p99, len(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="measuring time per scenario")
    args = parser.parse_args()
    # plans/s and p50/p99 are wall clock. plans/cpu-s and cpu p99 use the CPU time this
    # process got, i.e. what one dedicated core would do; they are robust to other load on
    # the machine (wall-clock p99 on a busy machine measures preemption, not planning).
    print(f"{'scenario':42} {'plans/s':>9} {'plans/cpu-s':>12} {'p50 µs':>9} {'p99 µs':>9} "
          f"{'cpu p99 µs':>11} {'plans':>7}")
    for name, run in scenarios().items():
        rate, cpu_rate, p50, p99, cpu_p99, count = measure(run, args.seconds)
        print(f"{name:42} {rate:9.0f} {cpu_rate:12.0f} {p50:9.1f} {p99:9.1f} {cpu_p99:11.1f} {count:7d}")


if __name__ == "__main__":
    main()
