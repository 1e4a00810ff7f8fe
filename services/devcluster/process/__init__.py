"""devcluster as several processes: one store process, N API workers (``--api-workers``)."""
