"""The trainer status endpoint under a burst: N pods report their progress at the same instant.

Starts a real nats-server, a devcluster and the status service with its TrainJobStatus endpoint
(HTTPS, as `trainyard up` serves it), creates N TrainJobs and a projected-style token for each
(TokenRequest with the TrainJob's status audience), then runs ``--rounds`` rounds in which all N
"pods" POST one report at the same wall-clock instant. Each pod reports as the examples' trainer
and the Kubeflow SDK's ``update_trainjob_status`` do: a new TLS connection per report (urllib),
from ``--generators`` processes with N/generators threads each.

Prints the answer time of every report (p50 / p99 / max, answered / failed) and what bounds it:
the CPU each process spent per report (status service, devcluster, nats-server, the generators)
and where the status service's time went, from its own
``trainyard_trainer_status_stage_seconds`` histogram (verify the token, write the status,
publish to the progress history). Asserts nothing; the target is p99 <= 1 s at 100 pods.

Usage: .venv/bin/python bench/progress.py [--pods 100] [--rounds 10] [--interval 2] [--generators 4]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from fixtures.devcluster import start_devcluster, stop_process  # noqa: E402
from fixtures.nats import NatsServer, free_port  # noqa: E402

import httpx  # noqa: E402

from e2e import cpu_seconds, devcluster_pids, loadavg, percentile, prometheus_samples, wait_ready  # noqa: E402
from waiting import say  # noqa: E402  (bench/)

NAMESPACE = "default"
TRAINJOBS = f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NAMESPACE}/trainjobs"


def trainjob(name: str) -> dict:
    # Suspended, with no planner running: nothing but the reports changes it.
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": True}}


def report_body(round_: int) -> bytes:
    status = {"progressPercentage": min(100, round_), "estimatedRemainingSeconds": 60,
              "metrics": [{"name": "loss", "value": f"{1.0 / (round_ + 1):.6f}"}],
              "lastUpdatedTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return json.dumps({"trainerStatus": status}).encode()


def _pod(url: str, token: str, ca: str, starts: list[float], out: list) -> None:
    context = ssl.create_default_context(cafile=ca)
    for round_, start in enumerate(starts):
        time.sleep(max(0.0, start - time.time()))
        began = time.perf_counter()
        request = urllib.request.Request(url, data=report_body(round_), method="POST",
                                         headers={"Authorization": f"Bearer {token}",
                                                  "Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, context=context, timeout=30).close()
            out.append((round_, time.perf_counter() - began, 200))
        except urllib.error.HTTPError as err:
            out.append((round_, time.perf_counter() - began, err.code))
        except OSError as err:
            out.append((round_, time.perf_counter() - began, f"{type(err).__name__}: {err}"))


def _generator(pods: list[tuple[str, str]], ca: str, starts: list[float], results) -> None:
    out: list = []
    threads = [threading.Thread(target=_pod, args=(url, token, ca, starts, out)) for url, token in pods]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.put((os.getpid(), out))


def stage_means(text: str) -> dict[str, tuple[float, float]]:
    """stage -> (count, mean seconds) of the endpoint's stage histogram."""
    sums = prometheus_samples(text, "trainyard_trainer_status_stage_seconds_sum")
    counts = prometheus_samples(text, "trainyard_trainer_status_stage_seconds_count")
    out = {}
    for labels, total in sums.items():
        count = counts.get(labels, 0.0)
        stage = dict(labels).get("stage", "?")
        out[stage] = (count, total / count if count else float("nan"))
    return out


def tokens(cluster, names: list[str]) -> dict[str, str]:
    from trainyard.pipeline.trainer_status import token_audience

    headers = {"Authorization": f"Bearer {cluster.token}"}
    with httpx.Client(base_url=cluster.url, verify=str(cluster.ca_cert), headers=headers, timeout=30) as http:
        out = {}
        for name in names:
            answer = http.post(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default/token",
                               json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                     "spec": {"audiences": [token_audience(NAMESPACE, name)],
                                              "expirationSeconds": 3600}})
            answer.raise_for_status()
            out[name] = answer.json()["status"]["token"]
        return out


def create_trainjobs(cluster, names: list[str]) -> None:
    headers = {"Authorization": f"Bearer {cluster.token}"}
    with httpx.Client(base_url=cluster.url, verify=str(cluster.ca_cert), headers=headers, timeout=30) as http:
        for name in names:
            http.post(TRAINJOBS, json=trainjob(name)).raise_for_status()


def run(args, workdir: Path) -> int:
    from trainyard.security import pki

    nats = NatsServer(workdir / "nats")
    nats.start()
    cluster = status = None
    try:
        cluster = start_devcluster(workdir / "devcluster")
        cluster.kubectl("apply", "--server-side",
                        *(arg for path in sorted((REPO / "deploy" / "crds").glob("*_*.yaml"))
                          for arg in ("-f", str(path))))
        certs = workdir / "status-certs"
        pki.save_bundle(certs, pki.issue(["127.0.0.1"], ca_common_name="bench-progress"))
        endpoint_port = free_port()
        log = open(workdir / "status.log", "ab")
        status = subprocess.Popen(
            [sys.executable, "-m", "trainyard.cli.main", "status", "--kubeconfig", str(cluster.kubeconfig),
             "--nats-url", nats.url, "--http-port", "0", "--log-level", "warning",
             "--trainjob-status-port", str(endpoint_port), "--trainjob-status-cert-dir", str(certs)],
            stdout=subprocess.PIPE, stderr=log, cwd=REPO, text=True)
        log.close()
        http_port = wait_ready(status, "status")
        names = [f"pod-{index:03d}" for index in range(args.pods)]
        create_trainjobs(cluster, names)
        token_of = tokens(cluster, names)
        from trainyard.pipeline.trainer_status import status_path

        base = f"https://127.0.0.1:{endpoint_port}"
        pods = [(base + status_path(NAMESPACE, name), token_of[name]) for name in names]
        say(f"{args.pods} TrainJobs and tokens ready; {args.rounds} rounds of {args.pods} reports at once, "
            f"every {args.interval:g} s, from {args.generators} generator processes")

        first = time.time() + 3.0  # the generators' threads are all started by then
        starts = [first + round_ * args.interval for round_ in range(args.rounds)]
        results: multiprocessing.Queue = multiprocessing.Queue()
        shares = [pods[index::args.generators] for index in range(args.generators)]
        generators = [multiprocessing.Process(target=_generator, args=(share, str(certs / "ca.crt"), starts, results))
                      for share in shares if share]
        for proc in generators:
            proc.start()
        pids = {"status": [status.pid], "devcluster": devcluster_pids(cluster), "nats-server": [nats.proc.pid],
                "generators": [proc.pid for proc in generators]}
        time.sleep(max(0.0, first - time.time() - 0.5))
        load_before = loadavg()
        cpu_before = {name: sum(cpu_seconds(pid) for pid in each) for name, each in pids.items()}
        gen_cpu: dict[int, float] = {}
        answers: list = []
        for _ in generators:
            pid, out = results.get(timeout=args.rounds * args.interval + 120)
            answers.extend(out)
            gen_cpu[pid] = cpu_seconds(pid)  # read before the process exits
        cpu_after = {name: sum(cpu_seconds(pid) for pid in each) for name, each in pids.items() if name != "generators"}
        for proc in generators:
            proc.join()
        metrics_text = httpx.get(f"http://127.0.0.1:{http_port}/metrics", timeout=10).text
        print_figures(args, answers, cpu_before, cpu_after, sum(gen_cpu.values()), stage_means(metrics_text),
                      load_before)
        return 0
    finally:
        if status is not None:
            stop_process(status)
        if cluster is not None:
            cluster.stop()
        nats.stop()


def print_figures(args, answers: list, cpu_before: dict, cpu_after: dict, generator_cpu: float,
                  stages: dict, load_before: str) -> None:
    ok = [seconds for _, seconds, code in answers if code == 200]
    failed = [(round_, code) for round_, _, code in answers if code != 200]
    total = len(answers)
    print(f"trainer status endpoint, {args.pods} pods reporting at once, {args.rounds} rounds "
          f"(load before {load_before}, after {loadavg()}; {os.cpu_count()} cores)")
    print(f"  answers: {len(ok)} of {total} 200" + (f"; not 200: {failed[:5]}" if failed else ""))
    if ok:
        print(f"  answer time: p50 {percentile(ok, 0.5) * 1000:.0f} ms, p99 {percentile(ok, 0.99) * 1000:.0f} ms, "
              f"max {max(ok) * 1000:.0f} ms (target p99 <= 1000 ms)")
        per_round = {}
        for round_, seconds, code in answers:
            if code == 200:
                per_round[round_] = max(per_round.get(round_, 0.0), seconds)
        print("  slowest answer per round (ms): " + " ".join(f"{per_round[r] * 1000:.0f}" for r in sorted(per_round)))
    cpu = {name: cpu_after[name] - cpu_before[name] for name in cpu_after}
    cpu["generators"] = generator_cpu - cpu_before.get("generators", 0.0)
    print("  CPU per report (ms): " + ", ".join(f"{name} {seconds / max(1, total) * 1000:.2f}"
                                              for name, seconds in cpu.items()))
    if stages:
        print("  status service, mean per report (ms): " + ", ".join(
            f"{stage} {mean * 1000:.1f}" for stage, (_, mean) in sorted(stages.items())))
    busy_burst = args.pods * sum(cpu[name] for name in ("status", "devcluster", "nats-server")) / max(1, total)
    print(f"  what bounds it: a burst of {args.pods} costs the control plane {busy_burst:.2f} CPU-seconds "
          f"(status {cpu['status'] / max(1, total) * args.pods:.2f}) beside the pods' own "
          f"{cpu['generators'] / max(1, total) * args.pods:.2f} on {os.cpu_count()} cores; the status service "
          f"answers on one event loop, so its CPU per burst is the floor of the slowest answer")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=100, help="pods reporting at once (one TrainJob each)")
    parser.add_argument("--rounds", type=int, default=10, help="bursts to send")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between bursts")
    parser.add_argument("--generators", type=int, default=4, help="processes the pods' threads run in")
    args = parser.parse_args()
    if min(args.pods, args.rounds, args.generators) < 1 or args.interval <= 0:
        parser.error("--pods, --rounds and --generators must be at least 1, --interval above 0")
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-progress-") as workdir:
        return run(args, Path(workdir))


if __name__ == "__main__":
    sys.exit(main())
