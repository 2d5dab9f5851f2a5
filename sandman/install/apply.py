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
from sandman.install import kubeversion, render

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
    for name, text in render.files(opts).items():  # the policy patch
        (dest / name).write_text(text)
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


def release_documents(kubectl: Kubectl) -> list[dict[str, Any]]:
    """Everything this release may have installed without an overlay to say
    what: the manifests and the node installer (``--delivery node`` only)."""
    docs = documents(render_overlay(kubectl, manifests_dir()))
    return docs + documents(render_overlay(kubectl, manifests_dir() / "node"))


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


def apply_secret(kubectl: Kubectl, docs: Sequence[dict[str, Any]], secret: dict[str, Any]) -> None:
    """Apply ``secret`` (a pull Secret) with the namespace the overlay makes, so
    that Sandman's pods find it when they start. kubectl reads it on stdin and
    says only its name: the credentials reach no file and no output."""
    ns = [d for d in docs if d.get("kind") == "Namespace"]
    body = yaml.safe_dump_all([*ns, secret])
    kubectl.run("apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-f", "-",
                input=body)  # fmt: skip


ROLLED_OUT = ("Deployment", "DaemonSet")  # what `kubectl rollout status` waits for
# A pod the scheduler cannot place may still get a node (a cluster autoscaler
# adding one takes a minute or two): said at once, fatal after this long.
UNSCHEDULABLE_GRACE_S = 120.0
WAIT_POLL_S = 2.0
# Container waiting reasons that retrying does not cure: the install stops
# at the first one, naming the pod, its node and the kubelet's message.
FATAL_WAITING = frozenset(
    {
        "ImagePullBackOff",  # ErrImagePull twice: no such image, no access, wrong platform
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",  # a Secret or ConfigMap key it names is missing
    }
)
# A crash loop is fatal after this many restarts (a component may exit once
# while, say, the apiserver is slow), or at once when the binary cannot run.
CRASH_RESTARTS = 3
# An ErrImagePull that will not pass on retry: the image has no build for the
# node's platform.
PLATFORM_MISMATCH = ("no match for platform", "no matching manifest", "exec format error")


def workloads(docs: Sequence[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(kind, namespace, name) of every Deployment and DaemonSet."""
    return [
        (d["kind"], d["metadata"].get("namespace", NAMESPACE), d["metadata"]["name"])
        for d in docs
        if d.get("kind") in ROLLED_OUT
    ]


def rolled_out(obj: dict[str, Any]) -> bool:
    """A Deployment or DaemonSet whose current template runs everywhere it
    should, all Available (the test `kubectl rollout status` makes)."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if status.get("observedGeneration", 0) < obj["metadata"].get("generation", 1):
        return False
    if obj["kind"] == "DaemonSet":
        want = status.get("desiredNumberScheduled", 0)
        return (
            status.get("updatedNumberScheduled", 0) >= want
            and status.get("numberAvailable", 0) >= want
        )
    want = spec.get("replicas", 1)
    updated = status.get("updatedReplicas", 0)
    return (
        updated >= want
        and status.get("replicas", 0) <= updated
        and status.get("availableReplicas", 0) >= updated
    )


@dataclass(frozen=True)
class PodProblem:
    """Why a pod is not running; ``fatal``: waiting will not fix it."""

    pod: str  # namespace/name
    node: str | None
    reason: str
    fatal: bool

    def __str__(self) -> str:
        where = f"on node {self.node}" if self.node else "(not scheduled)"
        return f"pod {self.pod} {where}: {self.reason}"


def pod_problem(pod: dict[str, Any]) -> PodProblem | None:
    """What keeps ``pod`` from starting, if anything (pure: a pod's JSON).

    Worked examples (tests/unit/install/test_wait.py):
    - Pending, PodScheduled False/Unschedulable "0/3 nodes are available: 3
      node(s) didn't match Pod's node affinity/selector" -> not fatal (yet),
      the scheduler's message;
    - container waiting ImagePullBackOff "... no match for platform in
      manifest" on node ip-10-0-1-5 -> fatal, naming node and message;
    - waiting ErrImagePull with the same message -> fatal at once (no retry
      makes an arm64 build appear); any other ErrImagePull -> not fatal;
    - CrashLoopBackOff, last exit 1 -> fatal from the third restart on, with
      the last exit; at once if that exit was "exec format error" (a binary
      of another architecture);
    - Running and Ready, or being deleted -> None.
    """
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return None
    name = f"{meta.get('namespace', '')}/{meta['name']}"
    node = spec.get("nodeName") or None
    if status.get("phase") == "Failed":
        why = status.get("reason") or "Failed"
        return PodProblem(name, node, f"{why}: {status.get('message', '')}".strip(": "), True)
    for cond in status.get("conditions") or []:
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            return PodProblem(name, None, f"unschedulable: {cond.get('message', '')}", False)
    statuses = [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]
    for cs in statuses:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason, message = waiting.get("reason", ""), waiting.get("message", "")
        if not reason or reason in ("PodInitializing", "ContainerCreating"):
            continue
        text = f"container {cs.get('name')}: {reason}"
        if message:
            text += f": {message}"
        last = ((cs.get("lastState") or {}).get("terminated")) or {}
        if reason == "CrashLoopBackOff" and last:
            text += (
                f" (last exit {last.get('exitCode')}"
                f"{', ' + last['reason'] if last.get('reason') else ''}"
                f"{': ' + last['message'].strip() if last.get('message') else ''})"
            )
        mismatch = any(m in f"{message} {last.get('message', '')}" for m in PLATFORM_MISMATCH)
        if mismatch:
            text += "; the image has no build for this node's platform (kubernetes.io/arch)"
        crashed = reason == "CrashLoopBackOff" and cs.get("restartCount", 0) >= CRASH_RESTARTS
        return PodProblem(name, node, text, reason in FATAL_WAITING or mismatch or crashed)
    return None


def _selector(obj: dict[str, Any]) -> dict[str, str]:
    return dict(((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {})


def _owned(pod: dict[str, Any], selector: dict[str, str]) -> bool:
    labels = pod["metadata"].get("labels") or {}
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _get_json(kubectl: Kubectl, *args: str) -> dict[str, Any]:
    out = kubectl.run(*args, "-o", "json", timeout=60).stdout
    return dict(json.loads(out))


def wait_available(
    kubectl: Kubectl,
    docs: Sequence[dict[str, Any]],
    timeout_s: float = READY_TIMEOUT_S,
    progress: Progress = print,
    unschedulable_grace_s: float = UNSCHEDULABLE_GRACE_S,
) -> None:
    """Every Deployment and DaemonSet rolled out (all pods of the new template
    Available: for the node installer, every node it runs on holds the tree).

    Fails fast rather than at the timeout when a pod cannot start (an image
    it cannot pull or run, a crash loop, a missing Secret key), naming the
    pod, its node and the reason; a pod the scheduler cannot place is said
    at once and fatal after ``unschedulable_grace_s``."""
    deadline = time.monotonic() + timeout_s
    pending = workloads(docs)
    waiting_since: dict[str, float] = {}
    said: set[str] = set()
    while True:
        problems: list[PodProblem] = []
        for ns in sorted({ns for _, ns, _ in pending}):
            names = [f"{k.lower()}/{n}" for k, wns, n in pending if wns == ns]
            got = _get_json(kubectl, "-n", ns, "get", *names)
            objs = {(o["kind"], ns, o["metadata"]["name"]): o for o in got.get("items", [got])}
            pods = _get_json(kubectl, "-n", ns, "get", "pods").get("items", [])
            for key in [k for k in pending if k[1] == ns]:
                obj = objs.get(key)
                if obj is None:
                    continue
                if rolled_out(obj):
                    pending.remove(key)
                    extra = ""
                    if key[0] == "DaemonSet" and not (obj.get("status") or {}).get(
                        "desiredNumberScheduled"
                    ):
                        extra = " (on no node: none matches its node affinity)"
                    progress(f"  {ns}/{key[2]} available{extra}")
                    continue
                sel = _selector(obj)
                problems += [p for p in map(pod_problem, (q for q in pods if _owned(q, sel))) if p]
        if not pending:
            return
        now = time.monotonic()
        for p in problems:
            if p.fatal:
                raise InstallError(
                    f"{p}; see `kubectl -n {p.pod.split('/')[0]} describe pod "
                    f"{p.pod.split('/')[1]}`"
                )
            first = waiting_since.setdefault(p.pod, now)
            if p.pod not in said:
                said.add(p.pod)
                progress(f"  waiting: {p}")
            if now - first >= unschedulable_grace_s:
                hint = ""
                if p.reason.startswith("unschedulable"):
                    hint = (
                        "; Sandman's pods run on Linux nodes of the images' architectures "
                        "(manifests/components/platforms)"
                    )
                raise InstallError(f"{p} (for {now - first:.0f} s){hint}")
        if now >= deadline:
            left = ", ".join(f"{k.lower()} {ns}/{n}" for k, ns, n in pending)
            detail = "; ".join(str(p) for p in problems) or "no pod reports a problem"
            raise InstallError(
                f"not available after {timeout_s:.0f} s: {left} ({detail}); see "
                "`kubectl describe` of each and its pods' events"
            )
        time.sleep(WAIT_POLL_S)


def server_version(kubectl: Kubectl) -> kubeversion.KubeVersion:
    """The apiserver's version (its ``/version``, readable by any client)."""
    out = kubectl.run("get", "--raw", "/version", timeout=60).stdout
    try:
        return kubeversion.KubeVersion.from_server(json.loads(out))
    except (ValueError, kubeversion.VersionError) as e:
        raise InstallError(f"the apiserver's /version: {e}") from None


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
