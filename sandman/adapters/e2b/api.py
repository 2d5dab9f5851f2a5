"""E2B's control plane (the REST calls of ``Sandbox.create/connect/kill/set_timeout/
get_info/list``) over Sandman: a template is an image, ``timeout`` is the lease,
``set_timeout`` extends it, ``kill`` releases the sandbox.

Errors are E2B's JSON ``{"code": HTTP status, "message": ...}``; a start
failure keeps Sandman's reason and says whether a retry can help.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web

from sandman.adapters.e2b import wire
from sandman.adapters.e2b.connect import MAX_MESSAGE_BYTES
from sandman.adapters.e2b.gateway import GATEWAY, Gateway
from sandman.client import DaemonError, Sandbox, SandboxGone, SandboxStartError
from sandman.clock import utc_now
from sandman.contract import (
    ANN_E2B_METADATA,
    ANN_E2B_TEMPLATE,
    ANN_EXPIRES_AT,
    LABEL_E2B,
    MAX_DURATION,
    annotations,
    format_time,
    parse_time,
)
from sandman.kube_async import PODS, ApiError
from sandman.quantity import parse_quantity

log = logging.getLogger(__name__)

# E2B's API uses 300 s when `timeout` is absent (its OpenAPI default).
DEFAULT_TIMEOUT_S = 300
# No lease is longer than the contract's longest duration (3650 d): a larger
# timeout is refused here rather than overflowing the lease arithmetic (a 500).
MAX_TIMEOUT_S = int(MAX_DURATION.total_seconds())
# NewSandboxV2 fields with no Sandman equivalent: asking for them fails
# loudly rather than being silently ignored (docs/adapters.md).
UNSUPPORTED = {
    "autoPause": "pausing a sandbox",
    "autoResume": "resuming a paused sandbox",
    "volumeMounts": "volume mounts",
    "network": "per-sandbox network rules",
    "mcp": "MCP servers",
    "iam": "workload identity",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiFailure(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"code": status, "message": message}, status=status)


def endpoint(fn: Handler) -> Handler:
    """Checks the API key; maps failures onto E2B's error JSON in one place."""

    async def handle(request: web.Request) -> web.StreamResponse:
        if not request.app[GATEWAY].api_key_ok(request.headers):
            return _error(401, "invalid or missing X-API-KEY (the gateway's key)")
        try:
            return await fn(request)
        except ApiFailure as e:
            return _error(e.status, e.message)
        except SandboxGone:
            return _error(404, f"sandbox {request.match_info.get('sid', '')} not found")
        except ApiError as e:
            log.warning("%s %s: Kubernetes API error: %s", request.method, request.path, e)
            return _error(502, f"the Kubernetes API failed: {e}")
        except SandboxStartError as e:
            # Retryable start failures (no capacity yet, a pull hiccup) are 503:
            # the caller may try again; the rest will not start on a retry.
            status = 503 if e.retryable else 400
            return _error(status, f"sandbox did not start: {e} (retryable={e.retryable})")

    return handle


async def _json(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        body = await request.json()  # counted against the app's client_max_size as it arrives
    except web.HTTPRequestEntityTooLarge:
        raise ApiFailure(
            413, f"the body is over {MAX_MESSAGE_BYTES} bytes, the gateway's bound"
        ) from None
    except ValueError:
        raise ApiFailure(400, "the body is not JSON") from None
    except RecursionError:
        raise ApiFailure(400, "the body's JSON is nested too deep") from None
    if not isinstance(body, dict):
        raise ApiFailure(400, "the body must be a JSON object")
    return body


def _timeout(body: dict[str, Any], default: int | None) -> int | None:
    value = body.get("timeout", default)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_TIMEOUT_S:
        raise ApiFailure(
            400, f"timeout must be a number of seconds from 1 to {MAX_TIMEOUT_S}, got {value!r}"
        )
    return value


def _strings(body: dict[str, Any], key: str) -> dict[str, str]:
    value = body.get(key) or {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ApiFailure(400, f"{key} must be an object of strings")
    return value


# -- handlers ---------------------------------------------------------------------------
@endpoint
async def create(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    body = await _json(request)
    for key, what in UNSUPPORTED.items():
        if body.get(key):
            raise ApiFailure(400, f"{key}: {what} is not supported by Sandman")
    if body.get("allowInternetAccess") is False:
        raise ApiFailure(
            400, "allowInternetAccess=false is not supported by the gateway; use a Sandman "
            "policy profile that denies egress instead"
        )  # fmt: skip
    template = str(body.get("templateID") or "")
    try:
        image = gw.config.image_for(template)
    except ValueError as e:
        raise ApiFailure(400, str(e)) from None
    timeout = _timeout(body, DEFAULT_TIMEOUT_S)
    metadata = _strings(body, "metadata")
    sb = await Sandbox.create(
        gw.client,
        image,
        namespace=gw.config.namespace,
        env=_strings(body, "envVars"),
        ttl=f"{timeout}s",
        labels={LABEL_E2B: "true"},
        annotations={ANN_E2B_TEMPLATE: template, ANN_E2B_METADATA: json.dumps(metadata)},
        node_selector=gw.config.node_selector,
        resources=gw.config.resources,
        timeout_s=gw.config.startup_timeout_s,
    )
    gw.add(sb)
    log.info("created sandbox %s from template %s (%s)", sb.name, template, image)
    return web.json_response(_sandbox(gw, sb), status=201)


@endpoint
async def connect(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    sid = request.match_info["sid"]
    timeout = _timeout(await _json(request), None)
    sb = await gw.attach(sid)
    if timeout is not None:
        until = utc_now() + dt.timedelta(seconds=timeout)
        # Connecting never shortens a lease, as E2B's API says of a running sandbox.
        if until > _expires_at(sb):
            await _extend(sb, timeout)
    return web.json_response(_sandbox(gw, sb), status=200)


@endpoint
async def kill(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    sid = request.match_info["sid"]
    sb = await gw.attach(sid)  # re-read: only a live gateway-made pod is released
    await gw.forget(sid)
    await sb.release()  # with the UID precondition: never a new pod of the same name
    log.info("released sandbox %s", sid)
    return web.Response(status=204)


@endpoint
async def set_timeout(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    timeout = _timeout(await _json(request), None)
    if timeout is None:
        raise ApiFailure(400, "timeout is required")
    await _extend(await gw.attach(request.match_info["sid"]), timeout)
    return web.Response(status=204)


@endpoint
async def get_info(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    sb = await gw.attach(request.match_info["sid"])
    return web.json_response(_detail(gw, sb.pod, with_token=True))


@endpoint
async def list_sandboxes(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    if request.query.get("state") and "running" not in request.query["state"].split(","):
        return web.json_response([])  # Sandman has no paused sandboxes
    want = _metadata_filter(request.query.get("metadata", ""))
    pods = (
        await gw.client.kube.list(PODS, gw.config.namespace, label_selector=f"{LABEL_E2B}=true")
    )["items"]
    docs = [
        _detail(gw, p, with_token=False) for p in pods if not p["metadata"].get("deletionTimestamp")
    ]
    docs = [d for d in docs if all(d["metadata"].get(k) == v for k, v in want.items())]
    return web.json_response(sorted(docs, key=lambda d: d["startedAt"]))


def _metadata_filter(query: str) -> dict[str, str]:
    """E2B's ``metadata`` query: ``k1=v1&k2=v2``, URL-encoded as one parameter."""
    return dict(parse_qsl(query)) if query else {}


@endpoint
async def not_supported(request: web.Request) -> web.Response:
    raise ApiFailure(501, f"{request.method} {request.path}: not supported by Sandman")


# -- helpers ----------------------------------------------------------------------------
def _sandbox(gw: Gateway, sb: Sandbox) -> dict[str, Any]:
    template = annotations(sb.pod).get(ANN_E2B_TEMPLATE, "")
    return wire.sandbox_doc(sb.name, template, gw.access_token(sb.name))


def _expires_at(sb: Sandbox) -> dt.datetime:
    raw = annotations(sb.pod).get(ANN_EXPIRES_AT)
    return parse_time(raw) if raw else utc_now()


async def _extend(sb: Sandbox, timeout_s: int) -> None:
    try:
        await sb.extend(dt.timedelta(seconds=timeout_s))
    except DaemonError as e:  # the policy's maximum lease refused it
        raise ApiFailure(400, f"timeout {timeout_s}s refused: {e.message}") from None
    except ApiError as e:
        raise ApiFailure(502, f"could not extend the lease: {e}") from None


def _detail(gw: Gateway, pod: dict[str, Any], *, with_token: bool) -> dict[str, Any]:
    ann = annotations(pod)
    name = pod["metadata"]["name"]
    try:
        metadata = json.loads(ann.get(ANN_E2B_METADATA) or "{}")
    except (ValueError, RecursionError):  # an annotation anyone with pod patch rights can edit
        metadata = {}
    limits = ((pod.get("spec") or {}).get("containers") or [{}])[0].get("resources", {})
    limits = limits.get("limits") or limits.get("requests") or {}
    created = pod["metadata"].get("creationTimestamp") or format_time(utc_now())
    return wire.detail_doc(
        name,
        ann.get(ANN_E2B_TEMPLATE, ""),
        started_at=created,
        end_at=ann.get(ANN_EXPIRES_AT, created),
        metadata=metadata if isinstance(metadata, dict) else {},
        cpu_count=_cpus(limits.get("cpu")),
        memory_mb=_mebibytes(limits.get("memory")),
        access_token=gw.access_token(name) if with_token else None,
    )


def _cpus(value: Any) -> int:
    try:
        return max(1, round(parse_quantity(str(value)))) if value else 0
    except ValueError:
        return 0


def _mebibytes(value: Any) -> int:
    try:
        return round(parse_quantity(str(value)) / 2**20) if value else 0
    except ValueError:
        return 0


def routes() -> list[web.RouteDef]:
    return [
        web.post("/v2/sandboxes", create),
        web.get("/v2/sandboxes", list_sandboxes),
        web.post("/v2/sandboxes/{sid}/connect", connect),
        web.delete("/sandboxes/{sid}", kill),
        web.get("/sandboxes/{sid}", get_info),
        web.post("/sandboxes/{sid}/timeout", set_timeout),
        web.post("/sandboxes/{sid}/pause", not_supported),
        web.post("/sandboxes/{sid}/resume", not_supported),
        web.post("/sandboxes/{sid}/snapshots", not_supported),
        web.post("/sandboxes/{sid}/fork", not_supported),
        web.get("/sandboxes/{sid}/metrics", not_supported),
        web.put("/sandboxes/{sid}/network", not_supported),
    ]
