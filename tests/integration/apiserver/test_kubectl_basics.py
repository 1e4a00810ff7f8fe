"""kubectl (the real binary) against a real devcluster process: discovery and basic verbs."""
from __future__ import annotations

import json


def test_kubectl_lists_default_namespaces_and_api_resources(devcluster_module):
    names = devcluster_module.kubectl("get", "ns", "-o", "name").stdout.split()
    assert {"namespace/default", "namespace/kube-system", "namespace/kubeflow-system"} <= set(names)
    resources = devcluster_module.kubectl("api-resources").stdout
    assert "pods" in resources and "customresourcedefinitions" in resources


def test_kubectl_version_reports_pinned_kubernetes(devcluster_module):
    out = json.loads(devcluster_module.kubectl("version", "-o", "json").stdout)
    assert out["serverVersion"]["gitVersion"].startswith("v1.36.")
