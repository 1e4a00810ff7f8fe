"""`make demo`: one TrainJob from nothing to Complete on a local trainyard, with live progress.

Runs `trainyard up` in the background on a fresh data dir (free ports, so it never clashes with a
stack you already run), applies examples/torch-ddp-cpu with real kubectl (`apply -k`), shows the TrainJob's
state, its pods and the training step/loss from the logs, prints the final conditions and where
to look next, then stops the stack. Exits 0 only if the TrainJob ended Complete.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainyard.errors import UserError
from trainyard.packaged import examples_dir

HELP = "Run the local demo: trainyard up, submit examples/torch-ddp-cpu, watch it train, stop."

EXAMPLES = examples_dir()
DEFAULT_EXAMPLE = EXAMPLES / "torch-ddp-cpu"
STEP_RE = re.compile(r"\bstep\b\D{0,3}(\d+)", re.IGNORECASE)
LOSS_RE = re.compile(r"\bloss\b\D{0,3}([-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)", re.IGNORECASE)


class DemoError(UserError):
    """The demo could not run or the TrainJob did not complete: one line, exit status 1."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=1)


# -- reading the example ----------------------------------------------------------------------

@dataclass(frozen=True)
class SubmittedJob:
    name: str
    namespace: str


def find_trainjob(example_dir: Path) -> SubmittedJob:
    import yaml

    if not example_dir.is_dir():
        raise DemoError(f"{example_dir} not found: the demo submits the TrainJob in that example")
    for path in sorted(example_dir.glob("*.y*ml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "TrainJob":
                metadata = doc.get("metadata") or {}
                return SubmittedJob(metadata["name"], metadata.get("namespace") or "default")
    raise DemoError(f"no TrainJob found in {example_dir}/*.yaml")


# -- what the progress display shows -----------------------------------------------------------

@dataclass
class Snapshot:
    state: str = "Submitted"
    conditions: list[dict[str, Any]] = field(default_factory=list)
    pods: list[tuple[str, str]] = field(default_factory=list)
    step: str = "-"
    loss: str = "-"
    last_log_line: str = ""

    @property
    def finished(self) -> bool:
        return self.state in ("Complete", "Failed")


def last_step_and_loss(log_text: str) -> tuple[str | None, str | None, str]:
    """The latest training step and loss printed in a log, and its last line."""
    lines = [line for line in log_text.splitlines() if line.strip()]
    for line in reversed(lines):
        step, loss = STEP_RE.search(line), LOSS_RE.search(line)
        if loss:
            return (step.group(1) if step else None), loss.group(1), lines[-1]
    return None, None, lines[-1] if lines else ""


def render(snapshot: Snapshot, job: SubmittedJob, elapsed_s: float) -> Any:
    from rich.table import Table

    table = Table(title=f"TrainJob {job.namespace}/{job.name}", title_justify="left", show_header=False,
                  box=None, padding=(0, 2))
    colour = {"Complete": "green", "Failed": "red", "Running": "cyan"}.get(snapshot.state, "yellow")
    table.add_row("state", f"[{colour}]{snapshot.state}[/]")
    table.add_row("elapsed", f"{elapsed_s:.0f}s")
    pods = ", ".join(f"{name} [{phase}]" for name, phase in snapshot.pods) or "(none yet)"
    table.add_row("pods", pods)
    table.add_row("step / loss", f"{snapshot.step} / {snapshot.loss}")
    if snapshot.last_log_line:
        table.add_row("log", snapshot.last_log_line[-100:])
    return table


# -- talking to the stack ------------------------------------------------------------------------

async def observe(client: Any, job: SubmittedJob, snapshot: Snapshot) -> None:
    from trainyard.kube.client import KubeError
    from trainyard.kube.resources import resource_for
    from trainyard.pipeline.trainjobs import state_of

    ns = job.namespace
    trainjob = await client.get(resource_for("trainer.kubeflow.org/v1alpha1", "TrainJob"), ns, job.name,
                                timeout_s=10)
    if trainjob is None:
        return
    snapshot.state = state_of(trainjob.get("status"))
    snapshot.conditions = (trainjob.get("status") or {}).get("conditions") or []
    pods = (await client.request("GET", f"/api/v1/namespaces/{ns}/pods", timeout_s=10,
                                 query={"labelSelector": f"jobset.sigs.k8s.io/jobset-name={job.name}"}
                                 )).get("items") or []
    snapshot.pods = sorted(
        (pod["metadata"]["name"], (pod.get("status") or {}).get("phase", "Pending")) for pod in pods
    )
    rank0 = [pod for pod in pods
             if (pod["metadata"].get("labels") or {}).get("batch.kubernetes.io/job-completion-index") == "0"
             and (pod["metadata"].get("labels") or {}).get("jobset.sigs.k8s.io/replicatedjob-name") == "node"
             and (pod.get("status") or {}).get("phase") in ("Running", "Succeeded", "Failed")]
    if rank0:
        try:
            text = await client.pod_log(ns, rank0[0]["metadata"]["name"], container="node", tail_lines=200)
        except KubeError:
            return
        step, loss, last_line = last_step_and_loss(text)
        snapshot.step = step or snapshot.step
        snapshot.loss = loss or snapshot.loss
        snapshot.last_log_line = last_line


async def follow(kubeconfig: Path, job: SubmittedJob, timeout_s: float, console: Any) -> Snapshot:
    from rich.live import Live

    from trainyard.supervisor.kubeapi import open_client

    snapshot = Snapshot()
    started = time.monotonic()
    client = await open_client(kubeconfig)
    try:
        if console.is_terminal:
            with Live(render(snapshot, job, 0), console=console, refresh_per_second=4) as live:
                while not snapshot.finished and time.monotonic() - started < timeout_s:
                    await observe(client, job, snapshot)
                    live.update(render(snapshot, job, time.monotonic() - started))
                    await asyncio.sleep(1)
        else:
            printed = ""
            while not snapshot.finished and time.monotonic() - started < timeout_s:
                await observe(client, job, snapshot)
                line = (f"{snapshot.state:<9} pods: {', '.join(f'{n}={p}' for n, p in snapshot.pods) or '-'}"
                        f"  step {snapshot.step} loss {snapshot.loss}")
                if line != printed:
                    console.print(f"[{time.monotonic() - started:5.0f}s] {line}", highlight=False)
                    printed = line
                await asyncio.sleep(1)
    finally:
        await client.close()
    return snapshot


# -- the stack in the background ---------------------------------------------------------------

def start_stack(data_dir: Path, console: Any, timeout_s: float) -> subprocess.Popen[bytes]:
    output = (data_dir.parent / f"{data_dir.name}-up.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "trainyard.cli.main", "up", "--free-ports", "--data-dir", str(data_dir)],
        stdout=output, stderr=subprocess.STDOUT, cwd=data_dir.parent,
    )
    state_file = data_dir / "stack.json"
    deadline = time.monotonic() + timeout_s
    with console.status("Starting trainyard (NATS, devcluster, runtimes, services)..."):
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise DemoError(f"trainyard up exited with code {process.returncode}:\n"
                                f"{Path(output.name).read_text(errors='replace')}")
            try:
                state = json.loads(state_file.read_text())
            except (FileNotFoundError, ValueError):
                state = {}
            if state.get("ready") and state.get("supervisor", {}).get("pid") == process.pid:
                return process
            time.sleep(0.2)
    raise DemoError(f"trainyard up was not ready after {timeout_s:.0f}s; see {output.name}")


def stop_stack(data_dir: Path, process: subprocess.Popen[bytes]) -> None:
    subprocess.run([sys.executable, "-m", "trainyard.cli.main", "down", "--data-dir", str(data_dir)],
                   capture_output=True, timeout=120)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def kubectl(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    from trainyard.supervisor.binaries import kubectl_binary

    return subprocess.run([str(kubectl_binary()), "--kubeconfig", str(kubeconfig), *args],
                          capture_output=True, text=True, timeout=120)


def print_summary(console: Any, snapshot: Snapshot, job: SubmittedJob, data_dir: Path, wall_s: float) -> None:
    from rich.table import Table

    table = Table(title=f"TrainJob {job.name}: final conditions", title_justify="left")
    for column in ("type", "status", "reason", "message"):
        table.add_column(column)
    for condition in snapshot.conditions:
        table.add_row(*(str(condition.get(key, "")) for key in ("type", "status", "reason", "message")))
    console.print(table)
    colour = "green" if snapshot.state == "Complete" else "red"
    console.print(f"[{colour}]TrainJob {job.name} ended {snapshot.state}[/] "
                  f"(last step {snapshot.step}, loss {snapshot.loss}); demo wall time {wall_s:.0f}s", soft_wrap=True)
    if snapshot.state != "Complete" and snapshot.last_log_line:
        console.print(f"  last line logged by node-0: {snapshot.last_log_line}", highlight=False, soft_wrap=True)
    console.print("Where to look next:", highlight=False, soft_wrap=True)
    console.print(f"  logs of every component and pod:  {data_dir}/logs, {data_dir}/devcluster", highlight=False, soft_wrap=True)
    console.print(f"  bring this stack back, job kept:  .venv/bin/trainyard up --data-dir {data_dir}", highlight=False, soft_wrap=True)
    console.print(f"  then inspect it:                  .venv/bin/kubectl --kubeconfig {data_dir}/kubeconfig "
                  f"get trainjob {job.name} -o yaml", highlight=False, soft_wrap=True)
    console.print("  your own stack and the SDK:       docs/quickstart.md, docs/sdk.md", highlight=False, soft_wrap=True)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        # Piped output (CI, `make demo | tee`): long lines, not 80-column wrapping.
        console = Console(width=160, soft_wrap=True)
    began = time.monotonic()
    example = Path(args.example).resolve()
    job = find_trainjob(example)
    data_dir = Path(tempfile.mkdtemp(prefix="trainyard-demo-")) / "data"
    data_dir.mkdir()
    console.print(f"trainyard demo: data dir {data_dir}", highlight=False)
    stack = start_stack(data_dir, console, timeout_s=args.startup_timeout)
    try:
        kubeconfig = data_dir / "kubeconfig"
        console.print(f"trainyard is up ({time.monotonic() - began:.0f}s). Submitting {example.relative_to(EXAMPLES.parent) if example.is_relative_to(EXAMPLES.parent) else example}",
                      highlight=False)
        # A kustomization ships the training script as a ConfigMap next to the TrainJob.
        mode = "-k" if (example / "kustomization.yaml").is_file() else "-f"
        applied = kubectl(kubeconfig, "apply", mode, str(example))
        if applied.returncode != 0:
            raise DemoError(f"kubectl apply {mode} {example} failed:\n{applied.stderr}")
        console.print(applied.stdout.rstrip(), highlight=False)
        dashboard_url = _dashboard_url(data_dir)
        if dashboard_url:
            console.print(f"Watch it live in the dashboard: {dashboard_url}", highlight=False, soft_wrap=True)
        snapshot = asyncio.run(follow(kubeconfig, job, args.timeout, console))
        if not snapshot.finished:
            console.print(f"[red]TrainJob {job.name} did not finish within {args.timeout:.0f}s (state {snapshot.state})[/]")
        print_summary(console, snapshot, job, data_dir, time.monotonic() - began)
        return 0 if snapshot.state == "Complete" else 1
    finally:
        with console.status("Stopping trainyard..."):
            stop_stack(data_dir, stack)
        console.print(f"trainyard stopped. Total {time.monotonic() - began:.0f}s.", highlight=False)


def _dashboard_url(data_dir: Path) -> str:
    try:
        return str(json.loads((data_dir / "stack.json").read_text()).get("dashboard_url") or "")
    except (OSError, ValueError):
        return ""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--example", default=str(DEFAULT_EXAMPLE), help="example directory to apply (one TrainJob)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the TrainJob to finish")
    parser.add_argument("--startup-timeout", type=float, default=180.0, help="seconds to wait for trainyard up")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainyard.cli.demo", description=HELP)
    configure(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except DemoError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
