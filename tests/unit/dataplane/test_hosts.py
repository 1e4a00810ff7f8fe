"""Pod DNS names as hosts-file lines (pure)."""
from __future__ import annotations

from trainyard_services.devcluster.dataplane.hosts import PodRecord, render_hosts


def test_hosts_file_names_pods_services_and_keeps_short_names_namespace_local():
    records = [PodRecord("ns1", "js-w-0-0", "js", "10.0.0.2"), PodRecord("ns2", "js-w-0-0", "js", "10.0.0.9")]
    text = render_hosts("10.0.0.3", "js-w-0-1", "js-w-0-1.js.ns1.svc.cluster.local", records, "ns1")
    lines = text.splitlines()
    assert "10.0.0.3\tjs-w-0-1.js.ns1.svc.cluster.local js-w-0-1" in lines
    assert "10.0.0.2\tjs-w-0-0.js.ns1.svc.cluster.local js-w-0-0.js.ns1.svc js-w-0-0.js.ns1 js-w-0-0.js" in lines
    assert "10.0.0.9\tjs-w-0-0.js.ns2.svc.cluster.local js-w-0-0.js.ns2.svc js-w-0-0.js.ns2" in lines
    assert "10.0.0.2\tjs.ns1.svc.cluster.local js.ns1.svc js.ns1" in lines
    assert lines[0].startswith("127.0.0.1\tlocalhost")


def test_not_ready_pods_are_published_only_when_the_service_says_so(tmp_path):
    from trainyard_services.devcluster.dataplane.hosts import HostsTable

    table = HostsTable()
    own = tmp_path / "hosts"
    table.add_pod("u1", own, "10.0.0.2", "js-w-0-0", "ns1", "js")
    table.set_services({("ns1", "js"): False})
    assert "js-w-0-0.js.ns1.svc.cluster.local js-w-0-0.js.ns1.svc" not in own.read_text()
    table.set_ready("u1", True)
    assert "10.0.0.2\tjs-w-0-0.js.ns1.svc.cluster.local js-w-0-0.js.ns1.svc" in own.read_text()
    table.set_ready("u1", False)
    table.set_services({("ns1", "js"): True})
    assert "10.0.0.2\tjs-w-0-0.js.ns1.svc.cluster.local js-w-0-0.js.ns1.svc" in own.read_text()
    table.drop_record("u1")
    assert "js-w-0-0.js.ns1.svc " not in own.read_text()


def _service(name: str, ns: str = "ops", selector: dict | None = None, headless: bool = True) -> dict:
    spec: dict = {"clusterIP": "None" if headless else "10.0.0.1"}
    if selector:
        spec["selector"] = selector
    return {"metadata": {"name": name, "namespace": ns}, "spec": spec}


def _slice(service: str, *endpoints: tuple[list[str], bool | None], ns: str = "ops") -> dict:
    return {"metadata": {"name": f"{service}-x", "namespace": ns, "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": addresses, **({"conditions": {"ready": ready}} if ready is not None else {})}
                          for addresses, ready in endpoints]}


def test_selectorless_headless_services_name_their_endpoint_slice_addresses():
    from trainyard_services.devcluster.dataplane.hosts import external_addresses

    services = [_service("status"), _service("pods-behind", selector={"app": "x"}), _service("vip", headless=False)]
    slices = [_slice("status", (["10.1.0.1"], None), (["10.1.0.2"], False), (["10.1.0.1", "10.1.0.3"], True)),
              _slice("pods-behind", (["10.9.9.9"], None)), _slice("vip", (["10.8.8.8"], None)),
              _slice("status", (["10.7.7.7"], None), ns="elsewhere")]
    external = external_addresses(services, slices)
    assert external == {("ops", "status"): ["10.1.0.1", "10.1.0.3"]}
    text = render_hosts("10.0.0.5", "p", None, [], "team", external)
    assert "10.1.0.1\tstatus.ops.svc.cluster.local status.ops.svc status.ops\n" in text
    assert "10.1.0.3\tstatus.ops.svc.cluster.local status.ops.svc status.ops\n" in text
