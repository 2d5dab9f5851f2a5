"""The webhook probe asks where the apiserver would, and sends nothing of anyone's."""

from __future__ import annotations

from sandman.contract import NAMESPACE
from sandman.reaper.probe import probe_review, webhook_url


def test_the_probe_goes_where_the_apiserver_goes() -> None:
    svc = {"clientConfig": {"service": {"name": "w", "namespace": "ns", "path": "/validate"}}}
    assert webhook_url(svc) == "https://w.ns.svc:443/validate"
    svc["clientConfig"]["service"]["port"] = 8443
    assert webhook_url(svc) == "https://w.ns.svc:8443/validate"
    url = {"clientConfig": {"url": "https://127.0.0.1:9443/validate"}}
    assert webhook_url(url) == "https://127.0.0.1:9443/validate"


def test_the_probe_review_is_a_dry_run_in_sandmans_own_namespace() -> None:
    req = probe_review("u-1")["request"]
    assert req["uid"] == "u-1" and req["dryRun"] is True
    assert req["namespace"] == NAMESPACE  # protected: answered without any API call
    assert req["object"] == req["oldObject"] and "spec" not in req["object"]
