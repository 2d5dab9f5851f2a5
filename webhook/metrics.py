"""The webhook's Prometheus metrics, on a registry of its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Admission must stay under ~10 ms p99 (design section 11); buckets resolve
# that range finely and still show a stall of seconds.
BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5)


@dataclass(frozen=True)
class WebhookMetrics:
    registry: CollectorRegistry
    admissions: Counter
    latency: Histogram
    cert_expiry: Gauge
    policy_reloads: Gauge
    policy_errors: Gauge
    events_dropped: Gauge

    @classmethod
    def create(cls) -> WebhookMetrics:
        r = CollectorRegistry()
        return cls(
            registry=r,
            admissions=Counter(
                "sandman_webhook_admissions_total",
                "admission decisions",
                ["endpoint", "result", "rule"],
                registry=r,
            ),
            latency=Histogram(
                "sandman_webhook_admission_duration_seconds",
                "time to decide a review",
                ["endpoint"],
                buckets=BUCKETS,
                registry=r,
            ),
            cert_expiry=Gauge(
                "sandman_webhook_cert_expiry_timestamp_seconds",
                "notAfter of the serving certificate",
                registry=r,
            ),
            policy_reloads=Gauge("sandman_webhook_policy_reloads", "policies loaded", registry=r),
            policy_errors=Gauge(
                "sandman_webhook_policy_errors", "policy loads rejected", registry=r
            ),
            events_dropped=Gauge(
                "sandman_webhook_events_dropped", "Events dropped (queue full)", registry=r
            ),
        )

    def observe(self, endpoint: str, outcome: Any, seconds: float) -> None:
        self.latency.labels(endpoint).observe(seconds)
        rules = outcome.rule_ids or [""]
        for rule in rules:
            self.admissions.labels(endpoint, outcome.result, rule).inc()

    def refresh(self, state: Any) -> None:
        certs = state.certs
        if certs is not None and certs.not_after is not None:
            self.cert_expiry.set(certs.not_after.timestamp())
        self.policy_reloads.set(state.policy.reloads)
        self.policy_errors.set(state.policy.errors)
        if state.recorder is not None:
            self.events_dropped.set(state.recorder.dropped)
