"""Sandman's images from a registry that wants credentials (pure: names and text in, documents out).

Two flags of `sandman install`, as platform teams give a workload pull
credentials:

- ``--image-pull-secret NAME`` (repeatable): a ``kubernetes.io/dockerconfigjson``
  Secret the admin already has in ``sandman-system``; every Sandman pod
  template names it in ``imagePullSecrets``.
- ``--registry-auth FILE``: a docker ``config.json`` (``auths`` with ``auth``
  or ``username``/``password``) that the install applies as the Secret
  ``sandman-registry-auth`` in ``sandman-system`` (kubectl reads it on stdin:
  it is never written to the overlay, printed or logged) and names like the
  above.

The daemon image is also pulled in every sandbox's own namespace: with the
``copy`` and ``shared`` deliveries each sandbox has an init container running
it, and the kubelet pulls with the pod's ``imagePullSecrets``. The webhook
therefore gets the same names (``--daemon-pull-secret``) and adds them to
each sandbox it gives an install step; the Secret must exist in the
sandbox's namespace, where the users' own pull Secret for their task images
lives too. Nothing copies credentials across namespaces: that would make
them readable to whoever reads Secrets in any sandbox namespace, and needs a
cluster-wide right to create pull Secrets that the webhook deliberately lacks
(manifests/webhook/secret-guard.yaml). Nodes that pull with their own
identity (ECR, Artifact Registry) need none of this; ``--delivery node``
pulls the daemon image only in ``sandman-system``.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from typing import Any

from sandman.contract import NAMESPACE
from sandman.registry_auth import AuthConfigError, Keychain

# The Secret `--registry-auth FILE` becomes.
REGISTRY_AUTH_SECRET = "sandman-registry-auth"
DOCKERCONFIGJSON = "kubernetes.io/dockerconfigjson"
# The webhook Deployment and its container (manifests/webhook/deployment.yaml).
WEBHOOK = "sandman-webhook"
WEBHOOK_FLAG = "--daemon-pull-secret"
# The kinds whose pod templates Sandman's images run in.
WORKLOAD_KINDS = ("Deployment", "DaemonSet")
# A Secret's name: an RFC 1123 subdomain.
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class PullSecretError(ValueError):
    pass


def check_names(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` in order, each once; refuses one that cannot name a Secret."""
    out: list[str] = []
    for name in names:
        if len(name) > 253 or not _NAME.fullmatch(name):
            raise PullSecretError(
                f"--image-pull-secret {name!r}: not a Secret name (lowercase letters, digits, "
                "'-' and '.')"
            )
        if name not in out:
            out.append(name)
    return tuple(out)


def patches(names: Sequence[str]) -> list[dict[str, Any]]:
    """kustomize patches: ``names`` in every Sandman pod template's
    ``imagePullSecrets``, and as the webhook's ``--daemon-pull-secret``.

    Worked example: ``("regcred",)`` gives a patch for all Deployments and one
    for all DaemonSets (a kind the install does not render is no error) adding
    ``imagePullSecrets: [{name: regcred}]``, and one adding
    ``--daemon-pull-secret=regcred`` to the webhook's arguments; ``()`` none.
    """
    if not names:
        return []
    refs = json.dumps([{"name": n} for n in names])
    out: list[dict[str, Any]] = [
        {
            "target": {"group": "apps", "kind": kind},
            "patch": f"- op: add\n  path: /spec/template/spec/imagePullSecrets\n  value: {refs}\n",
        }
        for kind in WORKLOAD_KINDS
    ]
    args = "".join(
        f"- op: add\n  path: /spec/template/spec/containers/0/args/-\n  value: {WEBHOOK_FLAG}={n}\n"
        for n in names
    )
    out.append({"target": {"kind": "Deployment", "name": WEBHOOK}, "patch": args})
    return out


def registry_auth_secret(text: str, source: str) -> dict[str, Any]:
    """The Secret ``--registry-auth`` applies, from a docker config.json's ``text``.

    Refuses a file the kubelet could not use, saying why without quoting it:
    not JSON, no ``auths``, or logins held by a credential helper
    (``credsStore``/``credHelpers``: `docker login` on a desktop writes those,
    and only the machine that ran it can ask the helper).
    """
    try:
        doc = json.loads(text)
    except ValueError:
        raise PullSecretError(
            f"--registry-auth {source}: not JSON (a docker config.json)"
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("auths"), dict) or not doc["auths"]:
        raise PullSecretError(
            f"--registry-auth {source}: no `auths` (a docker config.json: "
            '{"auths": {"REGISTRY": {"auth": "BASE64(user:password)"}}})'
        )
    try:
        keychain = Keychain.from_docker_config({"auths": doc["auths"]}, source=source)
    except AuthConfigError as e:
        raise PullSecretError(f"--registry-auth {e}") from None
    empty = [k for k, v in doc["auths"].items() if isinstance(v, dict) and not _has_login(v)]
    if empty or not len(keychain):
        helper = (
            " (they are in a credential helper: credsStore/credHelpers)"
            if (doc.get("credsStore") or doc.get("credHelpers"))
            else ""
        )
        raise PullSecretError(
            f"--registry-auth {source}: no login for {', '.join(sorted(empty)) or 'any registry'}"
            f"{helper}; the kubelet needs `auth` or `username`/`password` in the file "
            "(`skopeo login --authfile FILE REGISTRY` writes one)"
        )
    body = json.dumps({"auths": doc["auths"]}, separators=(",", ":"))
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": REGISTRY_AUTH_SECRET,
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/part-of": "sandman"},
        },
        "type": DOCKERCONFIGJSON,
        "data": {".dockerconfigjson": base64.b64encode(body.encode()).decode()},
    }


def _has_login(entry: dict[str, Any]) -> bool:
    return bool(
        entry.get("auth")
        or entry.get("username")
        or entry.get("identitytoken")
        or entry.get("registrytoken")
    )
