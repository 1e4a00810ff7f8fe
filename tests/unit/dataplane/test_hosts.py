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
