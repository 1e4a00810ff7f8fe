"""Run a whole local trainyard stack as supervised child processes.

`trainyard up` uses this package: it starts embedded NATS (JetStream), devcluster (API server and
data plane), installs the CRDs and default runtimes, then starts the watcher, planner, applier and
status services, restarting any that dies (with backoff) until `trainyard down` or Ctrl-C stops
everything. Public entry points:

- :class:`trainyard.supervisor.stack.StackConfig` and :func:`trainyard.supervisor.stack.run_stack`
- :func:`trainyard.supervisor.shutdown.stop_stack` (what `trainyard down` does)
- :class:`trainyard.supervisor.layout.StackLayout` (where a data dir keeps what)
"""
