"""The whole data plane in one asyncio task: caches, controllers, scheduler, kubelet."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from trainyard.kube.client import KubeClient
from trainyard.kube.resources import JOBSET

from .controllers import JobController, JobSetController
from .informers import JOB, POD, SERVICE, Informer
from .kubelet import (Kubelet, Scheduler, detect_gpus, machine_capacity, node_object,
                      podgroup_informers, register_node, runner_config)
from .network import open_network

log = logging.getLogger(__name__)
SYNC_TIMEOUT_S = 30.0


@dataclass
class DataPlaneOptions:
    kubeconfig: Path
    data_dir: Path
    node_name: str = "devcluster"
    time_scale: float = 0.1  # scales crash-loop and pod-failure back-offs (documented)
    isolate: bool = True
    capacity: dict[str, str] | None = None
    announce: Callable[[str], None] = field(default=lambda line: None)


async def run_dataplane(options: DataPlaneOptions, stop: asyncio.Event) -> None:
    """Run until ``stop`` is set; then stop every pod and remove what was made on the host."""
    client = await KubeClient.from_kubeconfig(str(options.kubeconfig))
    network = await open_network(options.isolate)
    message = f"data plane: {network.describe()}"
    log.info(message)
    options.announce(message)
    gpus = detect_gpus()
    capacity = options.capacity or machine_capacity(gpus)
    tasks: list[asyncio.Task[None]] = []
    kubelet: Kubelet | None = None
    try:
        await register_node(client, node_object(options.node_name, capacity, network.host_ip))
        pods = Informer(client, POD)
        jobs = Informer(client, JOB)
        services = Informer(client, SERVICE)
        jobsets = Informer(client, JOBSET)
        groups = podgroup_informers(client)
        informers = [pods, jobs, services, jobsets] + [informer for _, informer in groups]
        tasks += [asyncio.create_task(i.run(stop), name=f"informer-{i.resource.plural}") for i in informers]
        # Pods, Jobs and Services are built in; JobSet/PodGroup CRDs may be installed later.
        await asyncio.wait_for(asyncio.gather(pods.synced.wait(), jobs.synced.wait(),
                                              services.synced.wait()), SYNC_TIMEOUT_S)
        config = runner_config(options.data_dir, options.node_name, options.time_scale,
                               client._host, gpus)  # noqa: SLF001 - the API endpoint for pods
        kubelet = Kubelet(client, config, network, pods, services, gpus)
        kubelet.adopt_existing()
        kubelet._refresh_services()  # noqa: SLF001
        scheduler = Scheduler(client, options.node_name, capacity, pods, groups)
        jobset_controller = JobSetController(client, jobsets, jobs, services)
        job_controller = JobController(client, jobs, pods, options.time_scale)
        for obj in jobsets.items():
            jobset_controller.queue.add((obj["metadata"].get("namespace", ""), obj["metadata"]["name"]))
        for obj in jobs.items():
            job_controller.queue.add((obj["metadata"].get("namespace", ""), obj["metadata"]["name"]))
        tasks += [asyncio.create_task(scheduler.run(stop), name="scheduler"),
                  asyncio.create_task(jobset_controller.run(stop), name="jobset-controller"),
                  asyncio.create_task(job_controller.run(stop), name="job-controller")]
        options.announce("data plane: ready")
        await stop.wait()
    finally:
        if kubelet is not None:
            await kubelet.stop()
        stop.set()
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)
        await network.close()
        await client.close()
