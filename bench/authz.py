"""What RBAC costs a devcluster request.

Prints (1) the authorizer alone, in process: microseconds per request to derive the request's
attributes and decide, for the administrator (system:masters), a ServiceAccount allowed by
deploy/'s roles and one refused; (2) over HTTPS against a real `trainyard devcluster up`:
median and p99 latency of a GET of one ConfigMap, sequentially, with the administrator's token
and with the applier's ServiceAccount token (bound by deploy/services/rbac.yaml).

    .venv/bin/python bench/authz.py [--requests 400]
"""
from __future__ import annotations

import argparse
import asyncio
import ssl
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from fixtures.devcluster import start_devcluster  # noqa: E402

from trainyard.apimachinery import rbac, rbac_bootstrap  # noqa: E402
from trainyard.supervisor import identities  # noqa: E402

JOBSET = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/j"


def in_process(number: int = 20000) -> None:
    docs = [d for d in yaml.safe_load_all((REPO / "deploy" / "services" / "rbac.yaml").read_text()) if d]
    of = lambda kind: [d for d in docs if d["kind"] == kind]  # noqa: E731
    policy = rbac.Policy(of("Role"), of("ClusterRole") + rbac_bootstrap.cluster_roles(), of("RoleBinding"),
                         of("ClusterRoleBinding") + rbac_bootstrap.cluster_role_bindings())
    admin = rbac.UserInfo("devcluster-admin", (rbac.SYSTEM_MASTERS, rbac.AUTHENTICATED))
    applier = rbac.service_account_user("kubeflow-system", "trainyard-applier")
    cases = [("admin PATCH jobset", admin, "PATCH", JOBSET), ("applier PATCH jobset (allowed)", applier, "PATCH", JOBSET),
             ("applier GET pods (refused)", applier, "GET", "/api/v1/namespaces/default/pods")]
    for label, user, method, path in cases:
        seconds = timeit.timeit(lambda: policy.authorize(rbac.request_info(user, method, path, {})), number=number)
        print(f"authorizer, {label}: {seconds / number * 1e6:.1f} us/request")


def over_https(requests: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = start_devcluster(Path(tmp) / "data")
        try:
            server.kubectl("create", "configmap", "probe", "-n", "default", "--from-literal=a=b")
            written = asyncio.run(identities.prepare(server.kubeconfig, REPO / "deploy", Path(tmp) / "ids", ["applier"]))
            applier = yaml.safe_load(written["applier"].read_text())["users"][0]["user"]["token"]
            context = ssl.create_default_context(cafile=str(server.ca_cert))
            for label, token in (("admin token", server.token), ("applier ServiceAccount token", applier)):
                with httpx.Client(base_url=server.url, verify=context, headers={"Authorization": f"Bearer {token}"}) as c:
                    for _ in range(20):
                        c.get("/api/v1/namespaces/default/configmaps/probe").raise_for_status()
                    took = []
                    for _ in range(requests):
                        began = time.perf_counter()
                        c.get("/api/v1/namespaces/default/configmaps/probe").raise_for_status()
                        took.append((time.perf_counter() - began) * 1000)
                took.sort()
                print(f"HTTPS GET configmap, {label}: p50 {statistics.median(took):.2f} ms, "
                      f"p99 {took[int(len(took) * 0.99) - 1]:.2f} ms ({requests} requests)")
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    args = parser.parse_args()
    in_process()
    over_https(args.requests)


if __name__ == "__main__":
    main()
