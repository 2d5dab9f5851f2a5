"""OpenTelemetry traces of sandbox starts and fleet rollouts (optional: ``[otel]``).

Configured by the standard variables, read once per ``SandmanClient``:
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``)
turns it on; ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``
turn it off; ``OTEL_SERVICE_NAME`` (default ``sandman-sdk``),
``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_EXPORTER_OTLP_HEADERS`` are honoured
by the OpenTelemetry SDK. Spans go out over OTLP/HTTP (protobuf, port 4318
by convention); gRPC is not supported (it would pull in grpcio).

When nothing is configured, ``from_env`` returns ``NO_TRACING``, whose
methods do nothing, and the OpenTelemetry packages are never imported.

What is recorded (nothing on the hot path: spans are built after the fact
from the instants the SDK keeps anyway, see ``sandman.telemetry.phases``):

- ``sandman.sandbox``: one per sandbox start, ended by its first command's
  result (or its release, or its start failure), with children ``create``
  (or ``claim``), ``schedule``, ``pull``, ``start``, ``ready``,
  ``first_command`` and an event per instant. The kubelet's pull figures
  take one Event list per sandbox, in a background task.
- ``sandman.rollout``: one per fleet rollout (its own trace), with an
  ``attempt`` child per try and a ``task`` child; the sandbox trace of the
  rollout's sandbox nests under it.
- ``sandman.fleet.run``: one per fleet run, with its counters; rollouts
  carry ``sandman.run.id`` to find them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from sandman.telemetry.phases import TimingsLike, start_trace

if TYPE_CHECKING:
    from sandman.kube_async import KubeClient

log = logging.getLogger(__name__)

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
DEFAULT_SERVICE = "sandman-sdk"
# Sandbox traces still waiting for their Event list when the client closes
# get this long to finish: one LIST each, normally milliseconds.
CLOSE_GRACE_S = 5.0
INSTALL_HINT = "pip install 'sandman-k8s[otel]'"


def configured(environ: Mapping[str, str]) -> bool:
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(environ.get(v, "").strip() for v in ENDPOINT_VARS)


class NoTracing:
    """Tracing off: every method is a no-op (the default)."""

    enabled = False

    def sandbox(
        self,
        kube: KubeClient,
        pod: Mapping[str, Any],
        timings: TimingsLike,
        error: BaseException | None = None,
    ) -> None:
        return None

    def rollout(
        self, run_id: str, record: Any, t0: float
    ) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def fleet_run(self, run_id: str, data: Any, t0: float) -> None:
        return None

    async def aclose(self) -> None:
        return None


NO_TRACING = NoTracing()


def from_env(environ: Mapping[str, str] | None = None) -> NoTracing | OtlpTracing:
    """Tracing as the environment asks; NO_TRACING unless an endpoint is set.

    An endpoint without the ``[otel]`` packages logs a warning naming the fix
    and leaves tracing off: an exporter variable meant for another program in
    the same container must not break the SDK.
    """
    env = os.environ if environ is None else environ
    if not configured(env):
        return NO_TRACING
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        log.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but OpenTelemetry is not installed; no traces (%s)",
            INSTALL_HINT,
        )
        return NO_TRACING
    if env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf") not in ("http/protobuf", ""):
        log.warning("OTEL_EXPORTER_OTLP_PROTOCOL: only http/protobuf is supported; using it")
    return OtlpTracing(OTLPSpanExporter())


class OtlpTracing:
    """Builds spans with the OpenTelemetry SDK and exports them in batches.

    Owns its TracerProvider (the process-global one is left alone, so an
    application's own tracing setup is not overridden). Event-loop only for
    ``sandbox`` (it starts a task); ``aclose`` flushes and shuts down.
    ``wall_offset_ns`` is the epoch minus the monotonic clock, in ns, read
    once per trace so that consecutive phases share their boundaries exactly
    (injected in tests).
    """

    enabled = True

    def __init__(
        self,
        exporter: Any,
        *,
        batch: bool = True,
        wall_offset_ns: Callable[[], int] | None = None,
    ) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        from sandman import __version__

        resource = Resource.create({"service.name": DEFAULT_SERVICE})
        if os.environ.get("OTEL_SERVICE_NAME"):
            resource = resource.merge(Resource({"service.name": os.environ["OTEL_SERVICE_NAME"]}))
        self.provider = TracerProvider(resource=resource)
        proc = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
        self.provider.add_span_processor(proc)
        self.tracer = self.provider.get_tracer("sandman", __version__)
        self._offset_ns = wall_offset_ns or _wall_offset_ns
        self._pending: set[asyncio.Task[None]] = set()

    # -- sandbox starts ------------------------------------------------------------
    def sandbox(
        self,
        kube: KubeClient,
        pod: Mapping[str, Any],
        timings: TimingsLike,
        error: BaseException | None = None,
    ) -> None:
        """Record one sandbox's start; the kubelet's pull figures are fetched in
        a background task first (the caller does not wait for it)."""
        frozen = _Instants.of(timings)
        task = asyncio.get_running_loop().create_task(self._sandbox(kube, dict(pod), frozen, error))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _sandbox(
        self,
        kube: KubeClient,
        pod: dict[str, Any],
        t: _Instants,
        error: BaseException | None,
    ) -> None:
        events: list[dict[str, Any]] = []
        md = pod.get("metadata") or {}
        if t.scheduled is not None and md.get("uid") and md.get("namespace"):
            from sandman.kube_async import EVENTS

            try:
                doc = await kube.list(
                    EVENTS, md["namespace"], field_selector=f"involvedObject.uid={md['uid']}"
                )
                events = doc.get("items") or []
            except Exception as e:  # the trace is still worth having without pulls
                log.debug("events of %s not read for its trace: %s", md.get("name"), e)
        self.record_start(pod, t, events, error)

    def record_start(
        self,
        pod: Mapping[str, Any],
        timings: TimingsLike,
        events: list[dict[str, Any]],
        error: BaseException | None = None,
    ) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import Status, StatusCode

        st = start_trace(timings, pod, events)
        ns = self._wall()
        root = self.tracer.start_span(
            "sandman.sandbox", start_time=ns(st.start), attributes=st.attributes
        )
        if error is not None:
            reason = getattr(error, "reason", type(error).__name__)
            root.set_attribute("sandman.error.reason", str(reason))
            retryable = getattr(error, "retryable", None)
            if retryable is not None:
                root.set_attribute("sandman.error.retryable", bool(retryable))
            root.set_status(Status(StatusCode.ERROR, f"{reason}: {error}"[:500]))
        ctx = trace.set_span_in_context(root)
        for p in st.phases:
            self.tracer.start_span(p.name, context=ctx, start_time=ns(p.start)).end(
                end_time=ns(p.end)
            )
        for name, at in st.instants:
            root.add_event(name, timestamp=ns(at))
        root.end(end_time=ns(st.end))

    # -- fleets --------------------------------------------------------------------------
    @contextlib.contextmanager
    def rollout(self, run_id: str, record: Any, t0: float) -> Iterator[None]:
        """Around one rollout: its span is current inside (so the sandbox trace
        nests under it); attempts and the outcome are added from ``record``
        (a fleet RolloutRecord, times relative to ``t0``) when it ends."""
        from opentelemetry import trace
        from opentelemetry.trace import Status, StatusCode

        ns = self._wall()
        span = self.tracer.start_span(
            "sandman.rollout",
            context=trace.set_span_in_context(trace.INVALID_SPAN),  # a trace of its own
            start_time=ns(t0 + record.t_queued),
            attributes={
                "sandman.run.id": run_id,
                "sandman.problem": str(record.problem),
                "sandman.rollout": int(record.rollout),
            },
        )
        try:
            with trace.use_span(span, end_on_exit=False):
                yield
        finally:
            ctx = trace.set_span_in_context(span)
            for i, a in enumerate(record.attempts):
                end = a.t_done if a.t_done is not None else time.monotonic() - t0
                attrs: dict[str, Any] = {"sandman.attempt": i}
                if a.source is not None:
                    attrs["sandman.source"] = str(a.source)
                if a.sandbox:
                    attrs["k8s.pod.name"] = a.sandbox
                if a.error_reason:
                    attrs["sandman.error.reason"] = a.error_reason
                    attrs["sandman.error.retryable"] = bool(a.retryable)
                att = self.tracer.start_span(
                    "attempt", context=ctx, start_time=ns(t0 + a.t_requested), attributes=attrs
                )
                if a.error_reason:
                    att.set_status(Status(StatusCode.ERROR, a.error_reason))
                if a.t_acquired is not None:
                    self.tracer.start_span(
                        "task",
                        context=trace.set_span_in_context(att),
                        start_time=ns(t0 + a.t_acquired),
                    ).end(end_time=ns(t0 + max(a.t_acquired, end)))
                att.end(end_time=ns(t0 + end))
            outcome = str(record.outcome) if record.outcome is not None else "cancelled"
            span.set_attribute("sandman.outcome", outcome)
            if record.reward is not None:
                span.set_attribute("sandman.reward", float(record.reward))
            if record.detail:
                span.set_attribute("sandman.detail", str(record.detail)[:500])
            if outcome == "infra_failed":
                span.set_status(Status(StatusCode.ERROR, str(record.detail)[:500]))
            span.end(end_time=ns(time.monotonic()))

    def fleet_run(self, run_id: str, data: Any, t0: float) -> None:
        """One span for a finished run (RunData), with its shape and counters."""
        attrs: dict[str, Any] = {
            "sandman.run.id": run_id,
            "sandman.strategy": data.strategy,
            "sandman.reuse": bool(data.reuse),
            "sandman.problems": int(data.problems),
            "sandman.rollouts_per_problem": int(data.rollouts_per_problem),
            "sandman.concurrency": int(data.concurrency),
        }
        for f in dataclasses.fields(data.counters):
            attrs[f"sandman.counters.{f.name}"] = int(getattr(data.counters, f.name))
        end = t0 + (data.t_end if data.t_end is not None else time.monotonic() - t0)
        from opentelemetry import trace

        ns = self._wall()
        self.tracer.start_span(
            "sandman.fleet.run",
            context=trace.set_span_in_context(trace.INVALID_SPAN),
            start_time=ns(t0),
            attributes=attrs,
        ).end(end_time=ns(end))

    def _wall(self) -> Callable[[float], int]:
        """monotonic seconds -> epoch ns, with one offset for a whole trace."""
        off = self._offset_ns()
        return lambda s: off + round(s * 1e9)

    async def aclose(self) -> None:
        """Finish pending sandbox traces (bounded), then flush and shut down."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=CLOSE_GRACE_S)
        await asyncio.to_thread(self.provider.shutdown)


class _Instants:
    """A copy of a Timings at one moment (the fleet reuses Timings objects)."""

    __slots__ = ("created", "first_result", "ready", "requested", "scheduled", "started")

    def __init__(self, t: TimingsLike) -> None:
        self.requested = t.requested
        self.created = t.created
        self.scheduled = t.scheduled
        self.started = t.started
        self.ready = t.ready
        self.first_result = t.first_result

    @classmethod
    def of(cls, t: TimingsLike) -> _Instants:
        return cls(t)


def _wall_offset_ns() -> int:
    """The clock adapter: epoch ns minus time.monotonic() ns, now."""
    return time.time_ns() - time.monotonic_ns()
