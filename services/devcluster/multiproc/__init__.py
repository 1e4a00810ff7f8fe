"""A devcluster of several processes: one store process, N API workers (``--api-workers``)."""
