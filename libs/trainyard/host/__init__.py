"""The process host every service shares: flags and config, logging and tracing set-up, the
health and metrics server, the NATS session and Kubernetes client, signals and exit."""
