"""The whole data plane in one asyncio task: caches, controllers, scheduler, kubelet."""
from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from trainyard.kube.client import KubeClient
from trainyard.kube.resources import JOBSET, Resource

from .claims import ClaimBinder
from .controllers import JobController, JobSetController
from .informers import ENDPOINT_SLICE, JOB, NODE, POD, PVC, SERVICE, Informer
from .kubelet import (Kubelet, Scheduler, detect_gpus, machine_capacity, node_object,
                      podgroup_informers, register_node, runner_config)
from .network import BridgeNetwork, open_network
from .webhook import JobSetWebhook

log = logging.getLogger(__name__)
SYNC_TIMEOUT_S = 30.0
# Written in the devcluster's data dir once this start's Node is registered with this start's
# network address (and removed when the data plane stops): the Node stored by an earlier run
# names that run's bridge address, which no longer exists on the host.
DATAPLANE_READY = "dataplane-ready"
# The pod /24 of this data dir, taken again on the next start when still free: the Node's
# address then stays the same across restarts, so what was told it (the status service's
# bind address and EndpointSlice, a running supervisor's) stays true.
POD_SUBNET = "pod-subnet"
CRD = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)


@dataclass
class DataPlaneOptions:
    kubeconfig: Path
    data_dir: Path
    node_name: str = "devcluster"
    time_scale: float = 0.1  # scales crash-loop and pod-failure back-offs (documented)
    isolate: bool = True
    capacity: dict[str, str] | None = None
    jobset_feature_gates: frozenset[str] = frozenset()  # JobSet feature gates on (ElasticJobSet)
    announce: Callable[[str], None] = field(default=lambda line: None)


def _last_subnet(path: Path) -> ipaddress.IPv4Network | None:
    try:
        subnet = ipaddress.ip_network(path.read_text().strip())
    except (OSError, ValueError):
        return None  # first start, or an unreadable file: any free /24
    return subnet if isinstance(subnet, ipaddress.IPv4Network) else None


async def run_dataplane(options: DataPlaneOptions, stop: asyncio.Event) -> None:
    """Run until ``stop`` is set; then stop every pod and remove what was made on the host."""
    ready_file = options.data_dir / DATAPLANE_READY
    ready_file.unlink(missing_ok=True)
    client = await KubeClient.from_kubeconfig(str(options.kubeconfig))
    network = await open_network(options.isolate, _last_subnet(options.data_dir / POD_SUBNET))
    if isinstance(network, BridgeNetwork):
        (options.data_dir / POD_SUBNET).write_text(f"{network.subnet}\n")
    message = f"data plane: {network.describe()}"
    log.info(message)
    options.announce(message)
    gpus = detect_gpus()
    capacity = options.capacity or machine_capacity(gpus)
    tasks: list[asyncio.Task[None]] = []
    running: dict[str, asyncio.Task[None]] = {}
    kubelet: Kubelet | None = None
    webhook = JobSetWebhook(client, options.jobset_feature_gates)
    try:
        await register_node(client, node_object(options.node_name, capacity, network.host_ip))
        await webhook.start()
        pods = Informer(client, POD)
        jobs = Informer(client, JOB)
        services = Informer(client, SERVICE)
        jobsets = Informer(client, JOBSET)
        nodes = Informer(client, NODE)
        endpoint_slices = Informer(client, ENDPOINT_SLICE)
        claims = Informer(client, PVC)
        ClaimBinder(client, claims, options.data_dir / "claims")
        groups = podgroup_informers(client)
        informers = [pods, jobs, services, jobsets, nodes, endpoint_slices, claims] + \
            [informer for _, informer in groups]
        for informer in informers:
            running[informer.resource.plural + "." + informer.resource.group] = asyncio.create_task(
                informer.run(stop), name=f"informer-{informer.resource.plural}")
        by_crd = {i.resource.plural + "." + i.resource.group: i for i in (jobsets, *(g for _, g in groups))}

        def on_crd(event: str, crd: dict) -> None:
            # A CRD installed after start: list it now instead of waiting out the 404 back-off.
            name = (crd.get("metadata") or {}).get("name", "")
            informer = by_crd.get(name)
            if informer is None or informer.synced.is_set() or event == "DELETED" or stop.is_set():
                return
            running[name].cancel()
            running[name] = asyncio.create_task(informer.run(stop), name=f"informer-{name}")
        crds = Informer(client, CRD)
        crds.listeners.append(on_crd)
        tasks.append(asyncio.create_task(crds.run(stop), name="informer-crds"))
        # Pods, Jobs and Services are built in; JobSet/PodGroup CRDs may be installed later.
        await asyncio.wait_for(asyncio.gather(pods.synced.wait(), jobs.synced.wait(),
                                              services.synced.wait()), SYNC_TIMEOUT_S)
        config = runner_config(options.data_dir, options.node_name, options.time_scale,
                               client._host, gpus)  # noqa: SLF001 - the API endpoint for pods
        kubelet = Kubelet(client, config, network, pods, services, gpus, endpoint_slices)
        kubelet.adopt_existing()
        kubelet._refresh_services()  # noqa: SLF001
        scheduler = Scheduler(client, options.node_name, capacity, pods, groups, nodes)
        jobset_controller = JobSetController(client, jobsets, jobs, services,
                                             elastic="ElasticJobSet" in options.jobset_feature_gates)
        job_controller = JobController(client, jobs, pods, options.time_scale)
        for obj in jobsets.items():
            jobset_controller.queue.add((obj["metadata"].get("namespace", ""), obj["metadata"]["name"]))
        for obj in jobs.items():
            job_controller.queue.add((obj["metadata"].get("namespace", ""), obj["metadata"]["name"]))
        tasks += [asyncio.create_task(scheduler.run(stop), name="scheduler"),
                  asyncio.create_task(jobset_controller.run(stop), name="jobset-controller"),
                  asyncio.create_task(job_controller.run(stop), name="job-controller")]
        ready_file.write_text(json.dumps({"node": options.node_name, "host_ip": network.host_ip,
                                          "isolated": network.isolated}) + "\n")
        options.announce("data plane: ready")
        await stop.wait()
    finally:
        # Gone before the bridge (and its address) is.
        ready_file.unlink(missing_ok=True)
        with contextlib.suppress(Exception):
            await webhook.stop()
        if kubelet is not None:
            await kubelet.stop()
        stop.set()
        tasks.extend(running.values())
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)
        await network.close()
        await client.close()


def start_embedded(data_dir: Path, kubeconfig: Path, stop: asyncio.Event,
                   jobset_feature_gates: frozenset[str] = frozenset()) -> asyncio.Task[None]:
    """Start the data plane inside ``trainyard devcluster up`` once its API server serves.

    Its start-up line (which network mode it runs in) goes to stderr, as JSON logs do.
    """
    options = DataPlaneOptions(kubeconfig=kubeconfig, data_dir=data_dir, jobset_feature_gates=jobset_feature_gates,
                               announce=lambda line: print(line, file=sys.stderr, flush=True))

    async def guarded() -> None:
        try:
            await run_dataplane(options, stop)
        except Exception:
            log.exception("the data plane stopped with an error")

    return asyncio.get_running_loop().create_task(guarded(), name="dataplane")
