"""A process outside the cluster, reached from a pod by Service name: a headless Service
without a selector and its EndpointSlice naming the node's address (what the trainer status
endpoint uses)."""
from __future__ import annotations

from aiohttp import web

from fixtures.dataplane import wait_until
from trainyard.kube.resources import Resource

POD = Resource("", "v1", "pods", "Pod")
SERVICE = Resource("", "v1", "services", "Service")
ENDPOINT_SLICE = Resource("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice")
NODE = Resource("", "v1", "nodes", "Node", False)


async def test_a_pod_reaches_a_host_process_by_service_name(dataplane_cluster, kube, ns) -> None:
    [node] = (await kube.list(NODE, None))[0]
    address = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")

    async def hello(_: web.Request) -> web.Response:
        return web.Response(text="hello from outside")
    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, address, 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        await kube.create(SERVICE, ns, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "outside"},
                                        "spec": {"clusterIP": "None", "ports": [{"port": port}]}})
        await kube.create(ENDPOINT_SLICE, ns, {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "outside-1", "labels": {"kubernetes.io/service-name": "outside"}},
            "addressType": "IPv4", "ports": [{"port": port}], "endpoints": [{"addresses": [address]}]})
        url = f"http://outside.{ns}.svc:{port}/"
        await kube.create(POD, ns, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "caller"}, "spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "local", "command": [
                "python3", "-c", f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=10).read().decode())"]}]}})

        async def finished():
            pod = await kube.get(POD, ns, "caller")
            return pod if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") else None
        pod = await wait_until(finished, timeout=60, what="the caller to finish")
        logs = dataplane_cluster.server.kubectl("logs", "-n", ns, "caller").stdout
        assert pod["status"]["phase"] == "Succeeded", logs
        assert logs == "hello from outside\n"
    finally:
        await runner.cleanup()
