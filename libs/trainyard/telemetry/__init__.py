"""Logging, tracing, metrics, health endpoints and process lifecycle for the services."""
