"""The webhook's Prometheus metrics, on a registry of its own.

One count per admission (``sandman_webhook_admissions_total{endpoint,
result}``); the rules behind a denial, warning or audit are counted apart
(``sandman_webhook_rule_violations_total{endpoint, rule, result}``), so that
``sum(rate(admissions))`` is the admission rate however many rules a pod broke.
Totals kept by other objects (policy reloads, dropped Events) are mirrored
into counters at scrape time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sandman.telemetry.prom import CounterMirror, build_info
from sandman.webhook import __version__

# Admission must stay under ~10 ms p99 (design section 11); buckets resolve
# that range finely and still show a stall of seconds.
BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5)
# Registry lookups: a cache hit is microseconds, a remote registry 0.1-1 s,
# the budget 3 s (webhook/imageconfig.py).
LOOKUP_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5)


@dataclass(frozen=True)
class WebhookMetrics:
    registry: CollectorRegistry
    admissions: Counter
    violations: Counter
    latency: Histogram
    cert_expiry: Gauge
    policy_reloads: CounterMirror
    policy_errors: CounterMirror
    policy_rejected: Gauge
    events_dropped: CounterMirror
    image_lookups: Counter
    image_lookup_latency: Histogram
    unauthenticated: Counter

    @classmethod
    def create(cls) -> WebhookMetrics:
        r = CollectorRegistry()
        build_info(r, "webhook", __version__)
        return cls(
            registry=r,
            admissions=Counter(
                "sandman_webhook_admissions_total",
                "admission reviews answered, one per review, by result "
                "(injected, allowed, denied, warned, audited, skipped, malformed)",
                ["endpoint", "result"],
                registry=r,
            ),
            violations=Counter(
                "sandman_webhook_rule_violations_total",
                "policy rules a reviewed pod broke, one per rule, by what was done "
                "(denied, warned, audited)",
                ["endpoint", "rule", "result"],
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
            policy_reloads=CounterMirror(
                Counter("sandman_webhook_policy_reloads_total", "policies loaded", registry=r)
            ),
            policy_errors=CounterMirror(
                Counter(
                    "sandman_webhook_policy_errors_total",
                    "policy loads rejected (the previous policy stays)",
                    registry=r,
                )
            ),
            policy_rejected=Gauge(
                "sandman_webhook_policy_rejected",
                "1 while the policy text last read is rejected (the previous policy "
                "is in force), else 0",
                registry=r,
            ),
            events_dropped=CounterMirror(
                Counter(
                    "sandman_webhook_events_dropped_total",
                    "Events dropped (queue full)",
                    registry=r,
                )
            ),
            image_lookups=Counter(
                "sandman_webhook_image_lookups_total",
                "ENTRYPOINT/CMD lookups by result (hit, miss, error, timeout)",
                ["result"],
                registry=r,
            ),
            image_lookup_latency=Histogram(
                "sandman_webhook_image_lookup_duration_seconds",
                "time one admission waited for an image config",
                buckets=LOOKUP_BUCKETS,
                registry=r,
            ),
            unauthenticated=Counter(
                "sandman_webhook_unauthenticated_reviews_total",
                "reviews refused undecided as not the apiserver's, by reason "
                "(certificate: no accepted client certificate; inconsistent: "
                "fields the apiserver never sends together)",
                ["endpoint", "reason"],
                registry=r,
            ),
        )

    def observe_lookup(self, result: str, seconds: float) -> None:
        self.image_lookups.labels(result).inc()
        self.image_lookup_latency.observe(seconds)

    def observe(self, endpoint: str, outcome: Any, seconds: float) -> None:
        """One decided review: one admission, plus one count per rule it broke."""
        self.latency.labels(endpoint).observe(seconds)
        self.admissions.labels(endpoint, outcome.result).inc()
        for rule in outcome.rule_ids:
            self.violations.labels(endpoint, rule, outcome.result).inc()

    def malformed(self, endpoint: str) -> None:
        """A review that could not be read (answered 4xx, no decision)."""
        self.admissions.labels(endpoint, "malformed").inc()

    def refresh(self, state: Any) -> None:
        certs = state.certs
        if certs is not None and certs.not_after is not None:
            self.cert_expiry.set(certs.not_after.timestamp())
        self.policy_reloads.update(state.policy.reloads)
        self.policy_errors.update(state.policy.errors)
        self.policy_rejected.set(1 if state.policy.rejected else 0)
        if state.recorder is not None:
            self.events_dropped.update(state.recorder.dropped)
