"""Pure Kubernetes API machinery: patches, server-side apply, selectors, protobuf decoding.

No I/O here (besides reading the bundled Kubernetes definitions once). The devcluster API server
and the planning pipeline call these functions; `docs/apimachinery.md` describes the API.
"""
