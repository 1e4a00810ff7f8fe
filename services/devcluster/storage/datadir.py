"""The entries of a devcluster data dir, named once: the store owns the dir (it refuses one with
entries it does not know), the process wiring and the metrics endpoint find their files by these."""
from __future__ import annotations

DB_NAME = "devcluster.db"
LOCK_NAME = "devcluster.lock"
SOCKET_NAME = "store.sock"  # the store process's socket for API workers
PIDS_NAME = "api-workers"  # the workers' pids, one a line, while they serve
METRICS_DIR_NAME = "metrics"  # the workers' multiprocess metric files
PKI_NAME = "pki"
PODS_NAME = "pods"

# Anything else in a data dir means it is not ours.
KNOWN_ENTRIES = frozenset({
    DB_NAME, DB_NAME + "-wal", DB_NAME + "-shm", LOCK_NAME, SOCKET_NAME, PIDS_NAME, METRICS_DIR_NAME,
    PKI_NAME, PODS_NAME, "kubeconfig", "ready", "dataplane", "dataplane-ready", "pod-subnet", "logs",
})
