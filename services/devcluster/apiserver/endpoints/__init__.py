"""The HTTP endpoints: request and response bodies, discovery, OpenAPI, tables, watch, query
parameters and metrics."""
