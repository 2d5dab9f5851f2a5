"""Observability: metrics helpers, the sandbox inventory, and (optional) traces.

- ``prom``: build info and mirrored counters for the components (needs
  prometheus-client, ``[server]``).
- ``inventory``: counts of sandbox pods by phase and pool state (pure).
- ``phases``: a sandbox's start as phases from what the SDK records (pure).
- ``tracing``: OpenTelemetry traces of sandbox starts and fleet rollouts,
  exported over OTLP/HTTP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set
  (``[otel]``); nothing is imported and nothing costs when it is not.
- ``sdkmetrics``: the pool manager's claim latency and create budget on an
  optional metrics endpoint of the SDK process (``SANDMAN_METRICS_LISTEN``).

This package itself imports only the standard library: the SDK imports it.
"""
