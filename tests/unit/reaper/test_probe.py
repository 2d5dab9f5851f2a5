"""The webhook probe asks where the apiserver would, and sends no AdmissionReview."""

from __future__ import annotations

from sandman.reaper.probe import readyz_url


def test_the_probe_asks_readyz_on_the_host_and_port_the_apiserver_calls() -> None:
    svc = {"clientConfig": {"service": {"name": "w", "namespace": "ns", "path": "/validate"}}}
    assert readyz_url(svc) == "https://w.ns.svc:443/readyz"
    svc["clientConfig"]["service"]["port"] = 8443
    assert readyz_url(svc) == "https://w.ns.svc:8443/readyz"
    url = {"clientConfig": {"url": "https://127.0.0.1:9443/validate?x=1"}}
    assert readyz_url(url) == "https://127.0.0.1:9443/readyz"
    # Credentials in a URL are not the apiserver's to send, nor ours.
    url = {"clientConfig": {"url": "https://u:p@hook.example:9443/v"}}
    assert readyz_url(url) == "https://hook.example:9443/readyz"
