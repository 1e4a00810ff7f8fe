"""trainyard: the shared libraries (API models, planning pipeline, bus, kube helpers, telemetry)."""

__version__ = "0.1.0"
