"""Keys, markers and the reaper's trust against the real apiserver (issue 15 items 4, 7, 10, 11).

- the reaper acts only on pods whose admission marker verifies, and never in a
  system namespace (items 7, 11);
- a lease that ends while the admission webhook cannot admit extensions is
  held until the webhook has been back for the grace (item 4);
- a namespace deleted and re-created gets another access key; a rotation of
  the cluster key overlaps, then retires the old generation: its namespace
  keys are withdrawn and the reaper reclaims what still runs under it (item 10).
"""

from __future__ import annotations

import base64
import datetime as dt
import subprocess
import sys
import uuid
from typing import Any

import pytest
from kubernetes.client import AdmissionregistrationV1Api, CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman import tokens
from sandman.contract import (
    ANN_EXPIRES_AT,
    ANN_KEY_ID,
    LABEL_ID,
    NAMESPACE,
    format_time,
)
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.kube import api_client, raw
from sandman.harness.testing import free_port, wait_for
from sandman.tokens import AccessKeys, AdmissionKeys, KeyRetired
from tests.integration.test_reaper import events, exists, reapers, sandbox

__all__ = ["reapers"]  # the fixture, shared with test_reaper.py


def _pod(core: CoreV1Api, ns: str, name: str) -> dict[str, Any]:
    return raw(core.read_namespaced_pod(name, ns, _preload_content=False))


def _secret_data(core: CoreV1Api, ns: str, name: str) -> dict[str, str]:
    return core.read_namespaced_secret(name, ns).data or {}


def test_the_reaper_acts_only_on_what_the_webhook_admitted(
    core: CoreV1Api, namespace: str, reapers: Any
) -> None:
    # Keys that verify nothing of this cluster's, in a namespace of their own:
    # the reaper must leave an expired sandbox alone and say why.
    decoy_ns = f"{namespace[:50]}-keys"
    core.create_namespace({"metadata": {"name": decoy_ns}})
    try:
        decoy = AdmissionKeys({"0": b"x" * 32}).to_secret_data()
        core.create_namespaced_secret(
            decoy_ns, {"metadata": {"name": tokens.ADMISSION_KEY_SECRET}, "data": decoy}
        )
        core.create_namespaced_pod(namespace, sandbox("expired", "2s"))
        r = reapers("--no-leader-elect", f"--keys-namespace={decoy_ns}", "--extension-grace=0")
        ev = wait_for(
            lambda: events(core, namespace, "SandboxUnverified"), timeout=60, what="unverified"
        )
        assert "no valid admission marker" in ev[0]["message"]
        assert exists(core, namespace, "expired") and r.reclaimed() == 0
        # The same sandbox with the cluster's keys: reclaimed.
        r.proc.terminate()
        r.proc.wait(10)
        reapers("--no-leader-elect", "--extension-grace=0")
        wait_for(lambda: not exists(core, namespace, "expired"), timeout=60, what="reclaimed")
    finally:
        core.delete_namespace(decoy_ns)


def test_nothing_in_a_system_namespace_is_touched(
    core: CoreV1Api, namespace: str, reapers: Any
) -> None:
    # kube-system is outside the webhook, so a labeled pod there has no marker
    # and an expired lease annotation anyone could write.
    name = f"sb-{uuid.uuid4().hex[:6]}"
    bait = sandbox(name, "1h")
    bait["metadata"]["annotations"][ANN_EXPIRES_AT] = "2020-01-01T00:00:00Z"
    core.create_namespaced_pod("kube-system", bait)
    core.create_namespaced_pod(namespace, sandbox("control", "2s"))
    try:
        # One reaper over every namespace: the expired sandbox of the test
        # namespace is the control that the reaper did look.
        r = reapers("--no-leader-elect", "--extension-grace=0", watch_all=True)
        wait_for(lambda: not exists(core, namespace, "control"), timeout=60, what="control")
        assert exists(core, "kube-system", name) and r.reclaimed() == 1
        assert not events(core, "kube-system", "SandboxUnverified")
    finally:
        core.delete_namespaced_pod(name, "kube-system")


def _broken_webhook(namespace: str, webhook: str = "outage.sandman.dev") -> dict[str, Any]:
    """A webhook that admits lease extensions in ``namespace`` and is down."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": f"{webhook.split('.')[0]}-{namespace}"[:63]},
        "webhooks": [
            {
                "name": webhook,
                "admissionReviewVersions": ["v1"],
                "clientConfig": {"url": f"https://127.0.0.1:{free_port()}/validate"},
                "rules": [
                    {
                        "operations": ["UPDATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "timeoutSeconds": 2,
            }
        ],
    }


def test_leases_are_held_while_the_webhook_cannot_admit_extensions(
    cluster: LocalCluster, core: CoreV1Api, namespace: str, reapers: Any
) -> None:
    adm = AdmissionregistrationV1Api(api_client(cluster.kubeconfig))
    core.create_namespaced_pod(namespace, sandbox("extended", "6s"))
    core.create_namespaced_pod(namespace, sandbox("abandoned", "6s"))
    hook = _broken_webhook(namespace)
    adm.create_validating_webhook_configuration(hook)
    name = hook["metadata"]["name"]
    try:
        reapers(
            "--no-leader-elect",
            "--extension-grace=3s",
            f"--webhook-config={name}",
            "--webhook-name=outage.sandman.dev",
        )
        later = {"metadata": {"annotations": {ANN_EXPIRES_AT: _in(minutes=10)}}}
        with pytest.raises(ApiException) as refused:
            core.patch_namespaced_pod("extended", namespace, later)
        assert "outage.sandman.dev" in str(refused.value.body)
        held = wait_for(
            lambda: len(events(core, namespace, "LeaseHeld")) >= 2 or None,
            timeout=60,
            what="both leases held",
        )
        assert held and exists(core, namespace, "extended") and exists(core, namespace, "abandoned")
        assert not events(core, namespace, "LeaseExpired")
    finally:
        adm.delete_validating_webhook_configuration(name)
    # The webhook is back: the client's retry succeeds; the other sandbox is
    # reclaimed once the grace has passed.
    wait_for(lambda: _try_patch(core, namespace, "extended", later), timeout=30, what="extend")
    wait_for(lambda: not exists(core, namespace, "abandoned"), timeout=60, what="reclaimed")
    assert exists(core, namespace, "extended")
    ev = wait_for(lambda: events(core, namespace, "LeaseExpired"), timeout=30, what="Event")
    assert {e["involvedObject"]["name"] for e in ev} == {"abandoned"}


def test_a_webhook_not_yet_serving_when_the_reaper_starts_holds_no_lease(
    cluster: LocalCluster, core: CoreV1Api, namespace: str, reapers: Any
) -> None:
    # Right after an install the webhook is still starting: the reaper's probe
    # fails, but no extension was refused (the apiserver failed no call), so a
    # lease that ends is reclaimed on time, even under the default 2 min grace.
    adm = AdmissionregistrationV1Api(api_client(cluster.kubeconfig))
    hook = _broken_webhook(namespace, "starting.sandman.dev")
    adm.create_validating_webhook_configuration(hook)
    name = hook["metadata"]["name"]
    try:
        reapers(
            "--no-leader-elect",
            "--extension-grace=2m",
            f"--webhook-config={name}",
            "--webhook-name=starting.sandman.dev",
        )
        core.create_namespaced_pod(namespace, sandbox("ends", "4s"))
        ended = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=4)
        wait_for(lambda: not exists(core, namespace, "ends"), timeout=60, what="reclaimed")
        # On time: within the reaper's wait for one probe reading after the
        # lease ended (5 s) and the deletion, far inside the 2 min grace.
        assert dt.datetime.now(dt.UTC) - ended < dt.timedelta(seconds=30)
        assert not events(core, namespace, "LeaseHeld")
        assert events(core, namespace, "LeaseExpired")
    finally:
        adm.delete_validating_webhook_configuration(name)


def _try_patch(core: CoreV1Api, ns: str, name: str, body: dict[str, Any]) -> bool:
    try:
        core.patch_namespaced_pod(name, ns, body)
        return True
    except ApiException:
        return False


def _in(**delta: float) -> str:
    return format_time(dt.datetime.now(dt.UTC) + dt.timedelta(**delta))


def test_a_recreated_namespace_gets_another_access_key(core: CoreV1Api) -> None:
    name = f"t-recreated-{uuid.uuid4().hex[:6]}"

    def key() -> bytes | None:
        try:
            return base64.b64decode(_secret_data(core, name, tokens.ACCESS_SECRET)["key"])
        except ApiException:
            return None

    core.create_namespace({"metadata": {"name": name}})
    first = wait_for(key, timeout=30, what="access key")
    core.delete_namespace(name)
    wait_for(lambda: not _namespace_exists(core, name), timeout=120, what="namespace gone")
    core.create_namespace({"metadata": {"name": name}})
    try:
        second = wait_for(key, timeout=30, what="access key again")
        assert second != first
    finally:
        core.delete_namespace(name)


def _namespace_exists(core: CoreV1Api, name: str) -> bool:
    try:
        core.read_namespace(name)
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise


def _rotate(cluster: LocalCluster, *args: str) -> str:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sandman.webhook",
            "rotate-key",
            f"--kubeconfig={cluster.kubeconfig}",
            f"--namespace={NAMESPACE}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_rotating_the_cluster_key_overlaps_then_retires_the_old_generation(
    cluster: LocalCluster, core: CoreV1Api, namespace: str, reapers: Any
) -> None:
    core.create_namespaced_pod(namespace, sandbox("old", "1h"))
    old = _pod(core, namespace, "old")
    old_kid = old["metadata"]["annotations"][ANN_KEY_ID]
    access = AccessKeys.from_secret_data(
        wait_for(lambda: _secret_data(core, namespace, tokens.ACCESS_SECRET), timeout=30)
    )
    old_token = tokens.sandbox_token(access.key_for(old_kid), old["metadata"]["labels"][LABEL_ID])

    # Longer than the webhook's key poll (10 s), so that the overlap is seen.
    print(_rotate(cluster, "--overlap=20s"))
    reapers("--no-leader-elect", "--extension-grace=0")

    def new_sandbox() -> dict[str, Any] | None:
        name = f"new-{uuid.uuid4().hex[:5]}"
        core.create_namespaced_pod(namespace, sandbox(name, "1h"))
        pod = _pod(core, namespace, name)
        return pod if pod["metadata"]["annotations"][ANN_KEY_ID] != old_kid else None

    new = wait_for(new_sandbox, timeout=30, what="a sandbox under the new generation")
    new_kid = new["metadata"]["annotations"][ANN_KEY_ID]

    # During the overlap the namespace's users can compute both tokens.
    def both() -> AccessKeys | None:
        keys = AccessKeys.from_secret_data(_secret_data(core, namespace, tokens.ACCESS_SECRET))
        return keys if {old_kid, new_kid} <= set(keys.keys) else None

    during = wait_for(both, timeout=30, what="both generations published")
    assert tokens.sandbox_token(during.key_for(old_kid), old["metadata"]["labels"][LABEL_ID]) == (
        old_token
    )

    # After it: the old generation is withdrawn from the namespace, listed as
    # retired for the reaper, and the sandbox still under it is reclaimed.
    def retired() -> AccessKeys | None:
        keys = AccessKeys.from_secret_data(_secret_data(core, namespace, tokens.ACCESS_SECRET))
        return keys if old_kid not in keys.keys else None

    after = wait_for(retired, timeout=60, what="old generation withdrawn")
    with pytest.raises(KeyRetired):
        after.key_for(old_kid)
    adm = AdmissionKeys.from_secret_data(_secret_data(core, NAMESPACE, tokens.ADMISSION_KEY_SECRET))
    assert old_kid in adm.retired and new_kid not in adm.retired
    wait_for(lambda: not exists(core, namespace, "old"), timeout=60, what="old sandbox reclaimed")
    assert exists(core, namespace, new["metadata"]["name"])
    ev = wait_for(lambda: events(core, namespace, "KeyRetired"), timeout=30, what="KeyRetired")
    # "old", and the sandboxes made before the webhook saw the rotation (old generation too).
    retired_pods = {e["involvedObject"]["name"] for e in ev}
    assert "old" in retired_pods and new["metadata"]["name"] not in retired_pods
