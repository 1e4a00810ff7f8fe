"""The control plane's roles, named once. Each is a service process with its own bus identity
(NATS user) and ServiceAccount."""
from __future__ import annotations

# One of each per cluster: they watch, plan, apply and fold status for that cluster.
CLUSTER_ROLES = ("watcher", "planner", "applier", "status")
# On the manager cluster only: delegation to worker clusters, and the live web dashboard.
MANAGER_ROLES = ("dispatcher", "dashboard")
# The roles whose processes run the TrainJobs' control loop (the dashboard only shows it).
CONTROL_PLANE_ROLES = (*CLUSTER_ROLES, "dispatcher")
