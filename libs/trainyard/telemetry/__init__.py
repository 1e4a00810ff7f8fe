"""Logging, tracing and metrics: what every layer may record, depending on nothing above it."""
