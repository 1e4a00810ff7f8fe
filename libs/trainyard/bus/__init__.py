"""The NATS JetStream bus: subjects, envelopes, topology, publishing, consuming, KV stores.

Public face (see docs/bus.md); the modules beside it hold the machinery.
"""
from trainyard.bus.subjects import ObjectKey, decode_token, encode_token

__all__ = ["ObjectKey", "decode_token", "encode_token"]
