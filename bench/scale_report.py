"""The scale bench's figures from its ledger and scrapes (pure), and its table."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sandman.bench.report import percentile
from sandman.bench.scale_ledger import (
    STUCK_PENDING_S,
    Ledger,
    PodRecord,
    reclaim_latencies,
    stuck_reclaims,
    unreclaimed,
    without_daemon,
    wrong_deletions,
)
from sandman.bench.scale_metrics import PhaseStats, Sample, by_label, histogram_quantile, total

MIB = 1 << 20
ADMISSION = "apiserver_admission_webhook_admission_duration_seconds"
OUR_WEBHOOKS = ("inject.sandman.dev", "policy.sandman.dev")


def _ms(seconds: float) -> float:
    return seconds * 1000.0 if not math.isnan(seconds) else math.nan


def pod_figures(ledger: Ledger, pick: Callable[[PodRecord], bool]) -> dict[str, Any]:
    """Create, schedule and Ready figures of the sandboxes ``pick`` selects."""
    pods = [r for r in ledger.sandboxes() if pick(r)]
    created = [r for r in pods if r.created_at is not None]
    sent = [r.create_sent_at for r in pods if r.create_sent_at is not None]
    done = [r.created_at for r in created if r.created_at is not None]
    bound = [r for r in created if r.bound_at is not None]
    ready = [r.ready_at for r in created if r.ready_at is not None]
    create_ms = [(r.created_at - r.create_sent_at) * 1000 for r in created if r.create_sent_at]
    # How late the bench's own watch saw a pod after its create was answered:
    # the bias in every figure the watch stamps (bound, Ready, deleting).
    watch_lag_ms = [
        max(0.0, (r.seen_at - r.created_at) * 1000)
        for r in created
        if r.seen_at is not None and r.created_at is not None
    ]
    # Create answer -> binding seen by the watch: includes the watch's own
    # delivery delay, so an upper bound on the scheduler's latency.
    sched_ms = [max(0.0, (r.bound_at - r.created_at) * 1000) for r in bound]  # type: ignore[operator]
    t0 = min(sent) if sent else math.nan
    span = (max(done) - t0) if done else math.nan
    bound_span = (max(r.bound_at for r in bound) - t0) if bound else math.nan  # type: ignore[type-var]
    return {
        "sandboxes": len(pods),
        "created": len(created),
        "refused": sum(1 for r in pods if r.create_code not in (None, 201, -1)),
        "lost": sum(1 for r in pods if r.create_code == -1),
        "resent": sum(1 for r in pods if r.create_attempts > 1),
        "create_s": span,
        "create_rate": len(created) / span if span and span > 0 else math.nan,
        "scheduled_rate": len(bound) / bound_span if bound_span and bound_span > 0 else math.nan,
        "create_p50_ms": percentile(create_ms, 50),
        "create_p99_ms": percentile(create_ms, 99),
        "watch_lag_p50_ms": percentile(watch_lag_ms, 50),
        "watch_lag_p99_ms": percentile(watch_lag_ms, 99),
        "schedule_p50_ms": percentile(sched_ms, 50),
        "schedule_p99_ms": percentile(sched_ms, 99),
        "bound": len(bound),
        "ready": len(ready),
        # Lease ended (or otherwise deleted) before the pod was Ready.
        "deleted_before_ready": sum(
            1 for r in created if r.ready_at is None and r.deleting_at is not None
        ),
        "all_ready_s": (max(ready) - t0) if ready and len(ready) == len(created) else math.nan,
    }


def during(ledger: Ledger, start: float, end: float) -> dict[str, int]:
    """What happened to the sandboxes while a fault lasted: creates answered,
    pods bound (placement went on while the extender was gone), Ready, deletions
    begun (reclaims went on while the reaper leader was gone), and creates that
    had to be sent again (refused while the webhook or the apiserver was down)."""

    def within(t: float | None) -> bool:
        return t is not None and start <= t <= end

    pods = list(ledger.sandboxes())
    return {
        "created": sum(1 for r in pods if within(r.created_at)),
        "bound": sum(1 for r in pods if within(r.bound_at)),
        "ready": sum(1 for r in pods if within(r.ready_at)),
        "deleting": sum(1 for r in pods if within(r.deleting_at)),
        "resent": sum(
            1
            for r in pods
            if r.create_attempts > 1
            and r.create_sent_at is not None
            and r.create_sent_at <= end
            and (r.created_at is None or r.created_at >= start)
        ),
    }


def reclaim_figures(ledger: Ledger, pick: Callable[[PodRecord], bool]) -> dict[str, Any]:
    sub = Ledger(pods={k: r for k, r in ledger.pods.items() if pick(r)})
    lat = reclaim_latencies(sub)
    return {
        "reclaimed": len(lat),
        "reclaim_p50_s": percentile(lat, 50),
        "reclaim_p99_s": percentile(lat, 99),
        "reclaim_max_s": max(lat) if lat else math.nan,
    }


def admission_figures(api: Sample, webhook: Sample) -> dict[str, Any]:
    """From the apiserver's view of our two webhooks over a phase (bucket
    interpolation: its buckets are 5, 25, 100, 500 ms ...) and the webhook's
    own handler histogram (finer buckets, time inside the handler only)."""
    out: dict[str, Any] = {}
    for q in (50, 99):
        vals = []
        for hook in OUR_WEBHOOKS:
            v = histogram_quantile(api, ADMISSION, q / 100, name=hook)
            out[f"{hook.split('.')[0]}_p{q}_ms"] = _ms(v)
            vals.append(v)
        # Per call of either webhook (both histograms summed).
        both = {
            k: v
            for k, v in api.items()
            if k[0] == ADMISSION + "_bucket" and dict(k[1]).get("name") in OUR_WEBHOOKS
        }
        out[f"admission_p{q}_ms"] = _ms(histogram_quantile(both, ADMISSION, q / 100))
        out[f"webhook_handler_p{q}_ms"] = _ms(
            histogram_quantile(webhook, "sandman_webhook_admission_duration_seconds", q / 100)
        )
    out["webhook_calls"] = total(api, ADMISSION + "_count")
    rej = "apiserver_admission_webhook_rejection_count"
    out["webhook_rejections"] = total(api, rej)
    # What the rejections were: answers of ours (a policy denial; the claims
    # webhook refusing the ReplicaSet's pick of a held pod, by design), or
    # calls that failed (the webhook down: failurePolicy Fail refuses the create).
    out["webhook_denials"] = {
        k: v for k, v in by_label(api, rej, "name", error_type="no_error").items() if v
    }
    out["webhook_call_errors"] = total(api, rej, error_type="calling_webhook_error")
    codes = by_label(api, "apiserver_request_total", "code")
    out["apiserver_429"] = codes.get("429", 0.0)
    out["apiserver_5xx"] = sum(v for c, v in codes.items() if c.startswith("5"))
    out["apf_rejected"] = total(api, "apiserver_flowcontrol_rejected_requests_total")
    return out


def scheduler_figures(sched: Sample, extender: Sample) -> dict[str, Any]:
    """Where a pod's scheduling time goes, from sandman-scheduler's and the
    extender's own histograms over a phase: queue entry -> bound (the SLI:
    waiting in the queue included), the serial scheduling cycle (filters,
    scores and our extender's prioritize call), the Bind call (the
    apiserver's answer), and the extender's handler. The bench's
    ``schedule_p*`` runs from the create's answer to the binding its watch
    saw: it adds the time before the scheduler's watch delivered the pod."""
    out: dict[str, Any] = {}
    series = {
        "scheduler_sli": ("scheduler_pod_scheduling_sli_duration_seconds", sched, {}),
        "scheduler_cycle": ("scheduler_scheduling_algorithm_duration_seconds", sched, {}),
        "scheduler_bind": (
            "scheduler_framework_extension_point_duration_seconds",
            sched,
            {"extension_point": "Bind"},
        ),
        "extender_prioritize": (
            "sandman_extender_request_duration_seconds",
            extender,
            {"verb": "prioritize"},
        ),
    }
    for name, (metric, sample, match) in series.items():
        for q in (50, 99):
            out[f"{name}_p{q}_ms"] = _ms(histogram_quantile(sample, metric, q / 100, **match))
        # The scheduler's buckets end at 0.2048 s (Bind) and 0.4 s or so: a
        # quantile past the last one reads as that bound; the mean does not.
        n = total(sample, metric + "_count", **match)
        out[f"{name}_mean_ms"] = _ms(total(sample, metric + "_sum", **match) / n) if n else math.nan
    out["scheduled_attempts"] = by_label(sched, "scheduler_schedule_attempts_total", "result")
    out["extender_calls"] = total(extender, "sandman_extender_request_duration_seconds_count")
    return out


def resource_figures(stats: list[PhaseStats]) -> dict[str, Any]:
    rss: dict[str, float] = {}
    rss_sum: dict[str, float] = {}
    cpu: dict[str, float] = {}
    avail = [s.min_mem_available for s in stats if s.min_mem_available is not None]
    n = sum(s.samples for s in stats)
    for s in stats:
        for k, v in s.peak_rss.items():
            rss[k] = max(rss.get(k, 0.0), v / MIB)
        for k, v in s.peak_rss_sum.items():
            rss_sum[k] = max(rss_sum.get(k, 0.0), v / MIB)
        for k, v in s.cpu_s.items():
            cpu[k] = cpu.get(k, 0.0) + v
    return {
        "peak_rss_mib": {k: round(v, 1) for k, v in sorted(rss.items())},
        "peak_rss_all_replicas_mib": {k: round(v, 1) for k, v in sorted(rss_sum.items())},
        "cpu_s": {k: round(v, 1) for k, v in sorted(cpu.items())},
        "min_mem_available_mib": round(min(avail) / MIB) if avail else None,
        "load1_mean": round(sum(s.load1_sum for s in stats) / n, 2) if n else None,
        "load1_max": round(max(s.load1_max for s in stats), 2) if n else None,
    }


def invariants(
    ledger: Ledger, now: float, grace_s: float, stuck_after_s: float = STUCK_PENDING_S
) -> dict[str, Any]:
    wrong = wrong_deletions(ledger, stuck_after_s=stuck_after_s)
    missing = without_daemon(ledger)
    left = unreclaimed(ledger, now, grace_s)
    stuck = stuck_reclaims(ledger, stuck_after_s)
    return {
        "wrong_deletions": len(wrong),
        "wrong_examples": [f"{w.name}: {w.why} ({w.detail})" for w in wrong[:10]],
        # Never Ready for the reaper's stuck limit: its rule at work, not wrong.
        "stuck_reclaims": len(stuck),
        "stuck_examples": [r.name for r in stuck[:10]],
        "sandboxes_without_daemon": len(missing),
        "without_daemon_examples": [f"{r.name}: missing {list(r.missing)}" for r in missing[:10]],
        "unreclaimed": len(left),
        "unreclaimed_examples": [r.name for r in left[:10]],
        "lost_creates": sum(1 for r in ledger.sandboxes() if r.create_code == -1),
    }


def table_rows(results: dict[str, Any]) -> list[tuple[str, Any]]:
    """Flat (key, value) rows for the terminal table (nested dicts one level down)."""
    rows: list[tuple[str, Any]] = []
    for k, v in results.items():
        if isinstance(v, dict):
            for k2, v2 in v.items():
                if isinstance(v2, dict):
                    v2 = ", ".join(f"{a}={b}" for a, b in v2.items())
                elif isinstance(v2, list):
                    v2 = "; ".join(map(str, v2)) or "-"
                rows.append((f"{k}.{k2}", v2))
        elif isinstance(v, list):
            rows.append((k, "; ".join(map(str, v)) or "-"))
        else:
            rows.append((k, v))
    return rows
