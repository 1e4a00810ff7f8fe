"""Storage: the SQLite store, and the socket server and replicas through which API workers of a
multi-process devcluster share it."""
