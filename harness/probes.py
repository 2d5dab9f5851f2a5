"""Health probes shared by the harness, the tests and the benchmarks.

Everything probed here runs on loopback and is started by us: the cluster's
components, Sandman's components, a registry. Several serve TLS on
self-signed certificates they generate at start (controller-manager,
scheduler, the webhook before its CA is known): for those only reachability
is checked, so the probe does not verify the certificate.
"""

from __future__ import annotations

import ssl
import urllib.request


def insecure_context() -> ssl.SSLContext:
    """A client TLS context that checks neither the chain nor the host name:
    for probing and measuring our own loopback servers, never for trust."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def http_ok(
    url: str,
    *,
    context: ssl.SSLContext | None = None,
    insecure: bool = False,
    timeout: float = 2.0,
) -> bool:
    """True if GET ``url`` answers 200. Unreachable or an error status raises
    OSError (urllib's URLError / HTTPError), which health waits retry on."""
    if insecure:
        context = insecure_context()
    with urllib.request.urlopen(url, context=context, timeout=timeout) as resp:
        return bool(resp.status == 200)
