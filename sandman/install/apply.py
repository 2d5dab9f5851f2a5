"""Write an install overlay, apply it with kubectl, wait for Sandman, remove it.

kubectl does the applying (server-side apply, field manager
``sandman-install``): it is what an admin has, speaks every auth plugin
their kubeconfig uses, and renders kustomize itself; the same overlay then
works with ``kubectl apply -k`` or any GitOps tool.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from sandman import __version__
from sandman.contract import ACCESS_SECRET, ANN_INJECTED, LABEL_SANDBOX, NAMESPACE
from sandman.install import render

FIELD_MANAGER = "sandman-install"
# Apply order does not matter to the apiserver, but webhook configurations
# go first on removal: with them gone, a half-removed Sandman can never
# block a pod create (failurePolicy: Fail).
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
# Seconds for every Deployment to become Available: image pulls on a fresh
# node and the webhook's first TLS pass; a slow registry needs the most.
READY_TIMEOUT_S = 300
# Seconds for the webhook to inject a dry-run sandbox once it is Ready (the
# apiserver sees the caBundle through a watch, normally within a second).
INJECT_TIMEOUT_S = 60
POLL_S = 1.0

Progress = Callable[[str], None]


class InstallError(RuntimeError):
    pass


def manifests_dir() -> Path:
    """The manifests of this release (package data ``sandman.manifests``)."""
    path = Path(str(resources.files("sandman.manifests")))
    if not (path / "kustomization.yaml").exists():
        raise InstallError(f"the manifests are not installed ({path}/kustomization.yaml missing)")
    return path


def write_overlay(dest: Path, opts: render.InstallOptions, *, force: bool = False) -> Path:
    """Write (or rewrite) the overlay dir; refuses a kustomization it did not write."""
    kfile = dest / "kustomization.yaml"
    if kfile.exists() and not render.is_ours(kfile.read_text()) and not force:
        raise InstallError(
            f"{kfile} exists and was not written by `sandman install`; choose another "
            "--overlay-dir (or --force to overwrite it)"
        )
    dest.mkdir(parents=True, exist_ok=True)
    copy = dest / render.MANIFESTS_DIR
    tmp = dest / f".{render.MANIFESTS_DIR}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(
        manifests_dir(), tmp, ignore=shutil.ignore_patterns("__init__.py", "__pycache__", "*.pyc")
    )
    shutil.rmtree(copy, ignore_errors=True)
    tmp.rename(copy)
    body = yaml.safe_dump(render.kustomization(opts, __version__), sort_keys=False)
    kfile.write_text(render.header(opts, __version__) + body)
    return dest


@dataclass(frozen=True)
class Kubectl:
    """How to run kubectl against the target cluster."""

    binary: str = "kubectl"
    kubeconfig: str | None = None
    context: str | None = None
    extra: tuple[str, ...] = field(default=())

    def argv(self, *args: str) -> list[str]:
        exe = shutil.which(self.binary) or self.binary
        out = [exe]
        if self.kubeconfig:
            out.append(f"--kubeconfig={self.kubeconfig}")
        if self.context:
            out.append(f"--context={self.context}")
        return [*out, *self.extra, *args]

    def run(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        argv = self.argv(*args)
        try:
            proc = subprocess.run(
                argv, input=input, capture_output=True, text=True, timeout=timeout
            )
        except FileNotFoundError:
            raise InstallError(
                f"{self.binary} not found: install kubectl or pass --kubectl"
            ) from None
        if check and proc.returncode != 0:
            raise InstallError(f"kubectl {' '.join(args)}: {proc.stderr.strip() or proc.stdout}")
        return proc


def render_overlay(kubectl: Kubectl, overlay: Path) -> str:
    """What ``kubectl apply -k OVERLAY`` would send (kubectl's kustomize)."""
    return kubectl.run("kustomize", str(overlay)).stdout


def documents(rendered: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(rendered) if d]


def apply(
    kubectl: Kubectl, overlay: Path, *, server_dry_run: bool = False, force_conflicts: bool = False
) -> str:
    """Server-side apply. A field someone changed in the cluster since (typically
    the policy ConfigMap, edited live) is a conflict: nothing is applied and
    the error says how to keep or reset the edit, unless ``force_conflicts``."""
    args = ["apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-k", str(overlay)]
    if server_dry_run:
        args.append("--dry-run=server")
    if force_conflicts:
        args.append("--force-conflicts")
    try:
        return kubectl.run(*args).stdout
    except InstallError as e:
        if "conflict" not in str(e):
            raise
        raise InstallError(
            f"{e}\nSomething in the cluster was changed since it was applied (often the policy "
            "ConfigMap sandman-system/sandman-policy, edited live). To keep the change, put it "
            "in your overlay (a patch) and apply again; to reset it to what the overlay says, "
            "re-run with --force-conflicts. Nothing was applied."
        ) from None


ROLLED_OUT = ("Deployment", "DaemonSet")  # what `kubectl rollout status` waits for


def workloads(docs: Sequence[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(kind, namespace, name) of every Deployment and DaemonSet."""
    return [
        (d["kind"], d["metadata"].get("namespace", NAMESPACE), d["metadata"]["name"])
        for d in docs
        if d.get("kind") in ROLLED_OUT
    ]


def wait_available(
    kubectl: Kubectl,
    docs: Sequence[dict[str, Any]],
    timeout_s: float = READY_TIMEOUT_S,
    progress: Progress = print,
) -> None:
    """Every Deployment and DaemonSet rolled out (all pods of the new template
    Available: for the node installer, every node it runs on holds the tree)."""
    deadline = time.monotonic() + timeout_s
    for kind, ns, name in workloads(docs):
        left = max(1, int(deadline - time.monotonic()))
        res = f"{kind.lower()}/{name}"
        proc = kubectl.run("-n", ns, "rollout", "status", res, f"--timeout={left}s", check=False)
        if proc.returncode != 0:
            raise InstallError(
                f"{kind.lower()} {ns}/{name} did not become available: {proc.stderr.strip()}; "
                f"see `kubectl -n {ns} describe {res}` and its pods' events"
            )
        progress(f"  {ns}/{name} available")


def probe_pod(image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "sandman-install-probe-", "labels": {LABEL_SANDBOX: "true"}},
        # A command of its own: admission then needs no registry lookup.
        "spec": {"containers": [{"name": "probe", "image": image, "command": ["sleep", "1"]}]},
    }


def daemon_image(docs: Sequence[dict[str, Any]]) -> str:
    """The daemon image the webhook injects (its SANDMAN_DAEMON_IMAGE)."""
    for d in docs:
        if d.get("kind") != "Deployment" or d["metadata"]["name"] != "sandman-webhook":
            continue
        for c in d["spec"]["template"]["spec"]["containers"]:
            for e in c.get("env") or []:
                if e.get("name") == "SANDMAN_DAEMON_IMAGE":
                    return str(e["value"])
    raise InstallError("the rendered manifests have no sandman-webhook with SANDMAN_DAEMON_IMAGE")


def verify_injection(
    kubectl: Kubectl, image: str, namespace: str = "default", timeout_s: float = INJECT_TIMEOUT_S
) -> None:
    """A server-side dry-run sandbox create goes through both webhooks and is
    injected (changes nothing: sideEffects NoneOnDryRun)."""
    body = json.dumps(probe_pod(image))
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        proc = kubectl.run(
            "-n", namespace, "create", "--dry-run=server", "-o", "json", "-f", "-",
            input=body, check=False,
        )  # fmt: skip
        if proc.returncode == 0:
            annotations = json.loads(proc.stdout)["metadata"].get("annotations") or {}
            if ANN_INJECTED in annotations:
                return
            last = "the pod was admitted without the daemon"
        else:
            last = proc.stderr.strip()
        time.sleep(POLL_S)
    raise InstallError(f"the webhook does not inject sandboxes yet: {last}")


def uninstall(
    kubectl: Kubectl,
    docs: Sequence[dict[str, Any]],
    *,
    purge_access: bool = False,
    progress: Progress = print,
) -> None:
    """Webhook configurations first (and confirmed gone), then everything else.

    Sandboxes are not deleted: they are the users' pods and keep running (and
    serving) until they end; without the reaper only their
    ``activeDeadlineSeconds`` ends them.
    """
    for kind in WEBHOOK_KINDS:
        kubectl.run("delete", kind.lower(), "sandman", "--ignore-not-found", "--wait=true")
    for kind in WEBHOOK_KINDS:
        left = kubectl.run("get", kind.lower(), "sandman", "--ignore-not-found", "-o", "name")
        if left.stdout.strip():
            raise InstallError(f"{kind} sandman is still there; not removing the rest")
    progress("  webhook configurations removed: pod creates no longer call Sandman")
    rest = [d for d in docs if d.get("kind") not in WEBHOOK_KINDS]
    # Namespaced objects before their namespace, so nothing waits on a finalizer race.
    rest.sort(key=lambda d: d.get("kind") == "Namespace")
    kubectl.run(
        "delete", "--ignore-not-found", "--wait=true", "-f", "-", input=yaml.safe_dump_all(rest)
    )
    progress(f"  removed {len(rest)} objects (namespace {NAMESPACE} included)")
    if purge_access:
        out = kubectl.run(
            "get", "secrets", "-A", f"--field-selector=metadata.name={ACCESS_SECRET}",
            "-l", "app.kubernetes.io/managed-by=sandman", "-o", "json",
        ).stdout  # fmt: skip
        for item in json.loads(out)["items"]:
            ns = item["metadata"]["namespace"]
            kubectl.run("-n", ns, "delete", "secret", ACCESS_SECRET, "--ignore-not-found")
        progress(f"  removed {ACCESS_SECRET} from {len(json.loads(out)['items'])} namespaces")
    sandboxes = kubectl.run("get", "pods", "-A", "-l", f"{LABEL_SANDBOX}=true", "-o", "name")
    count = len(sandboxes.stdout.split())
    if count:
        progress(
            f"  {count} sandbox pods keep running until they end (not deleted: they are "
            f"yours; `kubectl delete pods -A -l {LABEL_SANDBOX}=true` removes them)"
        )
