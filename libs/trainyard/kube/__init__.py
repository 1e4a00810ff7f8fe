"""Kubernetes client helpers: REST client from a kubeconfig, list+watch, SSA, status, events."""
