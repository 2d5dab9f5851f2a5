"""Who may ask the webhook for a decision: the apiserver, and reviews only it could send.

The webhook's port is reachable by whatever the network lets through; a caller
that is not the apiserver could choose ``request.namespace`` (and so the rules
that apply), make the webhook look up registries and pull Secrets for it, and
have it write Warning Events with text it chose. Two layers keep it out:

* ``authenticate``: with a client CA configured (``--client-ca-file``), a review
  is answered only over a connection whose client certificate the TLS layer
  verified against that CA (and, if a list is given, whose CN is on it). The
  apiserver presents one when its AdmissionConfiguration gives it a kubeconfig
  for the webhook (docs/install.md).
* ``inconsistency``: reviews the apiserver could not have sent are refused even
  without a client CA (managed clusters, where the apiserver's flags are not
  the admin's): the apiserver fills ``metadata.namespace`` of a namespaced
  object from the request path before admission, always names the user and
  the request, and sends the kind that belongs to the resource.

Pure: a peer certificate (as ``ssl.SSLSocket.getpeercert`` returns it) or a
review body in, a refusal reason (or None) out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sandman.webhook.review import WebhookError

# (group, resource, subresource) -> the kind the apiserver sends for it, for the
# resources the webhook configurations register (manifests/webhook/
# webhookconfigurations.yaml). A subresource carries its parent's object.
KINDS: Mapping[tuple[str, str, str], tuple[str, str]] = {
    ("", "pods", ""): ("", "Pod"),
    ("", "pods", "ephemeralcontainers"): ("", "Pod"),
    ("", "pods", "resize"): ("", "Pod"),
}


class Unauthenticated(WebhookError):
    """The connection carried no client certificate the webhook accepts."""

    status = 403


class InconsistentReview(WebhookError):
    """A review whose fields contradict each other: not one the apiserver sent."""

    status = 400


def common_name(peercert: Mapping[str, Any] | None) -> str:
    """The subject CN of a verified peer certificate ("" when there is none)."""
    for rdn in (peercert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""


def authenticate(
    peercert: Mapping[str, Any] | None, *, required: bool, allowed_cns: Sequence[str] = ()
) -> str | None:
    """Why a caller is refused, or None.

    ``peercert`` is what the TLS layer verified: ``None`` or ``{}`` when the
    client sent no certificate (a certificate that fails verification ends
    the handshake before any request), so a non-empty one chains to the CA.
    """
    if not required:
        return None
    if not peercert:
        return "no client certificate: only the apiserver may send reviews (docs/install.md)"
    cn = common_name(peercert)
    if allowed_cns and cn not in allowed_cns:
        return f"client certificate CN {cn!r} is not one of the allowed callers"
    return None


def _namespace_of(obj: Any) -> str | None:
    if not isinstance(obj, dict):
        return None
    md = obj.get("metadata")
    if not isinstance(md, dict):
        return None
    ns = md.get("namespace")
    return ns if isinstance(ns, str) else ""


def inconsistency(body: Mapping[str, Any]) -> str | None:
    """Why a review (already parsed as one) cannot have come from the apiserver, or None."""
    req = body.get("request")
    if not isinstance(req, dict):
        return "the review has no request"
    if not req.get("uid"):
        return "request.uid is empty"
    user = req.get("userInfo")
    if not isinstance(user, dict) or not user.get("username"):
        return "request.userInfo.username is empty"
    resource = req.get("resource") if isinstance(req.get("resource"), dict) else {}
    kind = req.get("kind") if isinstance(req.get("kind"), dict) else {}
    key = (str(resource.get("group", "")), str(resource.get("resource", "")))
    sub = str(req.get("subResource") or "")
    expected = KINDS.get((*key, sub))
    if expected is None:
        name = f"{key[0] or 'core'}/{key[1]}" + (f"/{sub}" if sub else "")
        return f"resource {name} is not one this webhook is registered for"
    if (str(kind.get("group", "")), str(kind.get("kind", ""))) != expected:
        return f"request.kind {kind.get('kind')!r} does not belong to resource {key[1]!r}"
    namespace = req.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        return "request.namespace is empty for a namespaced resource"
    operation = req.get("operation")
    # What each operation carries (the apiserver's admission attributes): a
    # DELETE only the old object, a CREATE only the new one, an UPDATE both.
    objects = {"CREATE": ("object",), "UPDATE": ("object", "oldObject"), "DELETE": ("oldObject",)}
    if operation not in objects:
        return f"request.operation {operation!r} is not one this webhook is registered for"
    for field in objects[operation]:
        got = _namespace_of(req.get(field))
        if got is None:
            return f"request.{field} is missing for {operation}"
        if got != namespace:
            return (
                f"request.{field}.metadata.namespace {got!r} differs from "
                f"request.namespace {namespace!r}"
            )
    return None
