"""The webhook's HTTPS server: app factory, lifecycle, transport (no decisions).

Decisions live in ``review`` (a dict in, a dict out); this module moves bytes,
holds the caches those decisions read, counts and logs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from sandman import tokens
from sandman.clock import utc_now
from sandman.contract import REASON_INJECTED, REASON_POLICY_DENIED, REASON_SCHEDULER_NOT_RUNNING
from sandman.events import EventRecorder, ObjectRef
from sandman.informer import Informer
from sandman.kube_async import (
    MUTATING_WEBHOOKS,
    NAMESPACES,
    VALIDATING_WEBHOOKS,
    ApiError,
    KubeClient,
)
from sandman.serving import metrics_response, run_main, serve_app
from sandman.webhook import __version__, access
from sandman.webhook.access import AccessPublisher, KeyKeeper, load_or_create_ring
from sandman.webhook.caller import InconsistentReview, Unauthenticated, authenticate, inconsistency
from sandman.webhook.certs import CertManager
from sandman.webhook.config import WebhookConfig
from sandman.webhook.lookups import AdmissionLookups
from sandman.webhook.metrics import WebhookMetrics
from sandman.webhook.mutate import InjectionSettings, MutationError
from sandman.webhook.policy_source import PolicySource
from sandman.webhook.review import (
    Context,
    Outcome,
    Review,
    WebhookError,
    decide_mutation,
    decide_validation,
    parse_review,
    unknown_namespace_denial,
)
from sandman.webhook.rewrite import ImageFacts
from sandman.webhook.schedulers import warning_text

log = logging.getLogger("sandman.webhook")

# The apiserver's own cap on an admission request body is 3 MiB; a little more
# leaves room for the AdmissionReview envelope.
MAX_REVIEW_BYTES = 4 << 20
# After SIGTERM (which follows the Deployment's 10 s preStop pause), admissions
# are still answered this long, each closing its connection, so the
# apiserver's pooled connections to this replica are retired one by one
# instead of being closed under it (sandman.serving.serve_app).
# preStop + drain stay well inside terminationGracePeriodSeconds (30).
DRAIN_S = 5.0


@dataclass
class WebhookState:
    config: WebhookConfig
    client: KubeClient
    metrics: WebhookMetrics
    policy: PolicySource = field(default_factory=PolicySource)
    certs: CertManager | None = None
    namespaces: Informer | None = None
    recorder: EventRecorder | None = None
    keys: KeyKeeper | None = None  # the cluster key ring (webhook/access.py)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    extra_ns_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    extra_ns_uids: dict[str, str] = field(default_factory=dict)
    lookups: AdmissionLookups | None = None

    def ns_labels(self, namespace: str) -> dict[str, str]:
        if self.namespaces is not None:
            ns = self.namespaces.store.get(f"/{namespace}")
            if ns is not None:
                return (ns.get("metadata") or {}).get("labels") or {}
        return self.extra_ns_labels.get(namespace, {})

    def ns_uid(self, namespace: str) -> str:
        """The namespace's UID (its access key derives from it), or ""."""
        if self.namespaces is not None:
            ns = self.namespaces.store.get(f"/{namespace}")
            if ns is not None:
                return str((ns.get("metadata") or {}).get("uid") or "")
        return self.extra_ns_uids.get(namespace, "")

    def context(self, images: dict[str, ImageFacts] | None = None) -> Context:
        assert self.keys is not None
        ring = self.keys.ring  # one generation for the whole review

        def token_hash_for(namespace: str, sid: str) -> str:
            uid = self.ns_uid(namespace)
            if not uid:
                raise MutationError(f"namespace {namespace}: its UID is not known yet; retry")
            return access.token_hash_for(ring, namespace, uid, sid)

        return Context(
            policy=self.policy.current,
            namespace_labels=self.ns_labels,
            settings=InjectionSettings(
                daemon_image=self.config.daemon_image,
                version=__version__,
                daemon_delivery=self.config.daemon_delivery,
                daemon_shared_dir=self.config.daemon_shared_dir,
                node_installer=self.config.node_installer,
                daemon_pull_secrets=self.config.daemon_pull_secrets,
            ),
            now=utc_now,
            new_id=tokens.new_sandbox_id,
            token_hash_for=token_hash_for,
            marks=lambda namespace, sid: access.marks_for(ring, namespace, sid),
            images=images,
        )

    def ready(self) -> tuple[bool, list[str]]:
        missing = []
        if self.certs is None or not self.certs.ready.is_set():
            missing.append("tls")
        if not self.policy.loaded.is_set():
            missing.append("policy")
        if self.keys is None:
            missing.append("cluster-key")
        if self.namespaces is None or not self.namespaces.synced.is_set():
            missing.append("namespaces")
        return not missing, missing


STATE = web.AppKey("state", WebhookState)


async def _namespace_labels_for(st: WebhookState, namespace: str) -> bool:
    """Whether the labels of ``namespace`` (which select its rules) are known.

    A namespace created a moment ago may not be in the informer yet: it is
    fetched and remembered (the informer's copy wins once it has it). A read
    that fails is not remembered: the review is refused (retryable) where the
    rules matter, and the next one asks again.
    """
    if not namespace or namespace in st.extra_ns_labels:
        return True
    if st.namespaces is not None and f"/{namespace}" in st.namespaces.store:
        return True
    try:
        ns = await st.client.get(NAMESPACES, namespace)
    except (ApiError, aiohttp.ClientError, OSError, TimeoutError) as e:
        log.warning("labels of namespace %s unknown (%s); its sandboxes wait", namespace, e)
        return False
    md = ns.get("metadata") or {}
    st.extra_ns_uids[namespace] = str(md.get("uid") or "")
    st.extra_ns_labels[namespace] = md.get("labels") or {}
    return True


def _refuse(st: WebhookState, endpoint: str, reason: str, e: WebhookError) -> web.Response:
    """A review answered undecided: no rule selected, no lookup, no Event.

    Logged at debug only: whoever is knocking chooses how often, and an info
    line per request would let them flood the log; the counter shows it.
    """
    st.metrics.unauthenticated.labels(endpoint, reason).inc()
    log.debug("%s review refused (%s): %s", endpoint, reason, e)
    return web.json_response({"error": str(e)}, status=e.status)


async def _admit(request: web.Request, endpoint: str) -> web.Response:
    st = request.app[STATE]
    t0 = time.monotonic()
    transport = request.transport
    peercert = transport.get_extra_info("peercert") if transport is not None else None
    why = authenticate(
        peercert,
        required=st.config.client_ca_file is not None,
        allowed_cns=st.config.client_cns,
    )
    if why is not None:
        return _refuse(st, endpoint, "certificate", Unauthenticated(why))
    try:
        try:
            # read() returns the whole body; content.read(n) may return a part.
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise WebhookError("review too large") from None
        try:
            body = json.loads(raw)
        except ValueError:
            raise WebhookError("the body is not JSON") from None
        review = parse_review(body)
    except WebhookError as e:
        st.metrics.malformed(endpoint)
        return web.json_response({"error": str(e)}, status=e.status)
    forged = inconsistency(body)
    if forged is not None:
        return _refuse(st, endpoint, "inconsistent", InconsistentReview(forged))
    refused = None
    if not await _namespace_labels_for(st, review.namespace):
        refused = unknown_namespace_denial(review)
    images = None
    if endpoint == "mutate" and st.lookups is not None and refused is None:
        rule = st.policy.current().select(st.ns_labels(review.namespace))
        images = await st.lookups.images_for(review, rule)
    ctx = st.context(images)
    if refused is not None:
        outcome = refused
    elif endpoint == "mutate":
        outcome = decide_mutation(ctx, review)
    else:
        outcome = decide_validation(ctx, review)
    if endpoint == "validate" and outcome.allowed:
        await _check_scheduler(st, review, outcome)
    elapsed = time.monotonic() - t0
    st.metrics.observe(endpoint, outcome, elapsed)
    _record(st, review, outcome, endpoint)
    return web.json_response(outcome.response(review.uid))


async def _check_scheduler(st: WebhookState, r: Review, outcome: Outcome) -> None:
    """Warn (admission warning and an Event on the pod) when the sandbox's
    scheduler shows no running instance: the pod would stay Pending silently.
    Checked at validation, where the final schedulerName, name and UID exist."""
    if st.lookups is None:
        return
    found = await st.lookups.scheduler_problem(r)
    if found is None:
        return
    text = warning_text(*found)
    outcome.warnings.append(text)
    if r.dry_run or st.recorder is None:
        return
    md = r.obj.get("metadata") or {}
    ref = ObjectRef("Pod", r.namespace, md.get("name", ""), md.get("uid", ""))
    st.recorder.emit(ref, REASON_SCHEDULER_NOT_RUNNING, text, "Warning")


def _record(st: WebhookState, r: Review, outcome: Outcome, endpoint: str) -> None:
    if outcome.result in ("skipped", "allowed"):
        return
    if outcome.result == "injected":
        # One line per sandbox is noise at scale: debug level only.
        log.debug("injected a sandbox in %s (id %s)", r.namespace, outcome.sandbox_id)
    else:
        log.info(
            json.dumps(
                {
                    "endpoint": endpoint,
                    "namespace": r.namespace,
                    "result": outcome.result,
                    "rules": outcome.rule_ids,
                    "dryRun": r.dry_run,
                    "sandbox": outcome.sandbox_id,
                    "message": outcome.message[:300],
                }
            )
        )
    if r.dry_run or st.recorder is None:
        return  # sideEffects: NoneOnDryRun
    md = (r.obj or r.old or {}).get("metadata") or {}  # a DELETE has only the old object
    owners = md.get("ownerReferences") or []
    if outcome.result == "denied":
        # The pod does not exist (and may have no name yet); its owner does.
        if owners:
            o = owners[0]
            ref = ObjectRef(
                o["kind"], r.namespace, o["name"], o.get("uid", ""), o.get("apiVersion", "v1")
            )
        else:
            ref = ObjectRef("Pod", r.namespace, md.get("name") or md.get("generateName", ""))
        if r.operation == "DELETE":
            # Expected on every two-phase claim (the ReplicaSet's pick is the
            # held pod): counted in metrics, not worth an Event each.
            return
        st.recorder.emit(ref, REASON_POLICY_DENIED, outcome.message, "Warning")
    elif outcome.result == "injected" and st.config.event_on_inject:
        ref = ObjectRef("Pod", r.namespace, md.get("name") or md.get("generateName", ""))
        st.recorder.emit(ref, REASON_INJECTED, f"daemon injected, sandbox id {outcome.sandbox_id}")


async def mutate_handler(request: web.Request) -> web.Response:
    return await _admit(request, "mutate")


async def validate_handler(request: web.Request) -> web.Response:
    return await _admit(request, "validate")


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def readyz(request: web.Request) -> web.Response:
    ok, missing = request.app[STATE].ready()
    return web.json_response({"ok": ok, "waiting_for": missing}, status=200 if ok else 503)


async def metrics(request: web.Request) -> web.Response:
    st = request.app[STATE]
    st.metrics.refresh(st)
    return metrics_response(st.metrics.registry)


def create_app(config: WebhookConfig, client: KubeClient, certs: CertManager) -> web.Application:
    state = WebhookState(config=config, client=client, metrics=WebhookMetrics.create(), certs=certs)
    app = web.Application(client_max_size=MAX_REVIEW_BYTES)
    app[STATE] = state
    app.router.add_post("/mutate", mutate_handler)
    app.router.add_post("/validate", validate_handler)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.cleanup_ctx.append(_lifecycle)
    return app


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    st = app[STATE]
    cfg = st.config
    st.client.open()
    tasks: list[asyncio.Task[Any]] = []
    ring = await load_or_create_ring(st.client, cfg.namespace)
    keeper = KeyKeeper(st.client, cfg.namespace, ring)
    await keeper.reconcile()  # the reaper's admission keys exist before the first marker
    st.keys = keeper
    publisher = AccessPublisher(st.client, keeper, set(cfg.excluded_namespaces))
    st.namespaces = Informer(st.client, NAMESPACES, publisher.on_namespace)
    st.recorder = recorder = EventRecorder(st.client, "sandman-webhook")
    st.lookups = AdmissionLookups.build(cfg, st.client, st.metrics.observe_lookup)
    if not cfg.publish_access:
        st.namespaces.handler = lambda _kind, _obj: None
    tasks += [
        asyncio.ensure_future(st.namespaces.run(st.stop)),
        asyncio.ensure_future(st.recorder.run(st.stop)),
        asyncio.ensure_future(keeper.run(st.stop)),
    ]
    if cfg.publish_access:
        tasks.append(asyncio.ensure_future(publisher.run(st.stop)))
    if st.certs is not None:
        tasks.append(asyncio.ensure_future(st.certs.run(st.stop)))
    if cfg.policy_configmap:
        tasks.append(
            asyncio.ensure_future(
                st.policy.watch_configmap(
                    st.client, cfg.policy_configmap, st.stop, report=recorder.emit
                )
            )
        )
    elif cfg.policy_file:
        tasks.append(asyncio.ensure_future(st.policy.watch_file(cfg.policy_file, st.stop)))
    else:
        st.policy.loaded.set()  # built-in defaults
    yield
    st.stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if st.lookups is not None:
        await st.lookups.close()
    await st.client.close()


def cert_manager(config: WebhookConfig, client: KubeClient) -> CertManager:
    return CertManager(
        client if config.tls_cert_file is None else None,
        namespace=config.namespace,
        secret_name=config.tls_secret,
        dns_names=config.dns_names,
        ip_addresses=config.extra_ips,
        webhook_configs=(
            (MUTATING_WEBHOOKS, config.config_name),
            (VALIDATING_WEBHOOKS, config.config_name),
        ),
        ca_validity=config.ca_validity,
        cert_validity=config.cert_validity,
        cert_file=config.tls_cert_file,
        key_file=config.tls_key_file,
        work_dir=config.work_dir,
        client_ca_file=config.client_ca_file,
    )


async def _serve(config: WebhookConfig) -> int:
    if config.client_ca_file is None:
        log.warning(
            "no --client-ca-file: any caller that reaches this port may send reviews; "
            "only their consistency is checked (docs/install.md, "
            "'Authenticating the apiserver to the webhook')"
        )
    client = KubeClient.from_kubeconfig(config.kubeconfig, user_agent="sandman-webhook")
    certs = cert_manager(config, client)
    client.open()
    # The TLS material must exist before the site can start.
    await certs.reconcile()
    app = create_app(config, client, certs)
    log.info("webhook serving on https://%s:%d (version %s)", config.host, config.port, __version__)
    return await serve_app(
        app,
        host=config.host,
        port=config.port,
        ssl_context=certs.ssl_context(),
        on_stop=app[STATE].stop.set,
        drain_s=DRAIN_S,
    )


def serve(config: WebhookConfig) -> int:
    return run_main(lambda: _serve(config))
