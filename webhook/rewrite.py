"""What changes in the target container and the pod when it becomes a sandbox (pure).

The decisions behind the injection patch that concern what the pod *runs*:
which container gets the daemon, the command the daemon starts (the pod's,
or the image's ENTRYPOINT/CMD read from its registry), whether the pod ends
with that command, how its readiness probe combines with the daemon's, and
which scheduler places it. ``mutate`` turns them into patch operations;
docs/sandbox-pods.md is the table of what changes, for users.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sandman.contract import (
    ANN_CONTAINER,
    ANN_EXIT_WITH_COMMAND,
    ContractError,
    annotations,
)
from sandman.oci import ImageConfig

# kubectl's own choice of container (exec, logs, attach): what a user who
# already set it means by "the" container of the pod.
ANN_DEFAULT_CONTAINER = "kubectl.kubernetes.io/default-container"
DEFAULT_SCHEDULER = "default-scheduler"

# Owners whose pods run to completion: a sandbox among them ends with its
# command, so that the owner sees the exit code it would see without Sandman.
# (group, kind); CronJobs, RayJobs and JobSets reach us through the Jobs they
# create.
RUN_TO_COMPLETION_OWNERS = frozenset(
    {
        ("batch", "Job"),
        ("argoproj.io", "Workflow"),
        ("tekton.dev", "TaskRun"),
        ("kubeflow.org", "PyTorchJob"),
        ("kubeflow.org", "TFJob"),
        ("kubeflow.org", "MPIJob"),
        ("kubeflow.org", "XGBoostJob"),
        ("kubeflow.org", "PaddleJob"),
        ("kubeflow.org", "JAXJob"),
    }
)


class RewriteError(ContractError):
    """The pod asks for something the rewrite cannot do; the message says how to fix it."""


# -- the target container ---------------------------------------------------------
def target_index(pod: dict[str, Any]) -> tuple[int, list[str]]:
    """The container that gets the daemon, and warnings about the choice.

    ``sandman.dev/container`` names it (an unknown name is an error), else
    ``kubectl.kubernetes.io/default-container`` (an unknown name falls back,
    as kubectl does, with a warning), else the first container.
    """
    containers = (pod.get("spec") or {}).get("containers") or []
    if not containers:
        raise RewriteError("the pod has no containers")
    names = [c.get("name") for c in containers]
    ann = annotations(pod)
    wanted = ann.get(ANN_CONTAINER)
    if wanted is not None:
        if wanted not in names:
            raise RewriteError(
                f"annotation {ANN_CONTAINER}={wanted!r} names no container (have {names})"
            )
        return names.index(wanted), []
    default = ann.get(ANN_DEFAULT_CONTAINER)
    if default is not None:
        if default in names:
            return names.index(default), []
        return 0, [
            f"annotation {ANN_DEFAULT_CONTAINER}={default!r} names no container; "
            f"the daemon goes into the first one ({names[0]})"
        ]
    return 0, []


def image_to_resolve(pod: dict[str, Any]) -> str | None:
    """The target's image when its command must come from the image (no ``command``)."""
    try:
        idx, _ = target_index(pod)
    except RewriteError:
        return None  # mutate() denies it with the reason
    c = pod["spec"]["containers"][idx]
    if c.get("command") or not c.get("image"):
        return None
    return str(c["image"])


# -- the command ------------------------------------------------------------------
@dataclass(frozen=True)
class ImageFacts:
    """What the webhook learned about an image before deciding (or why it could not)."""

    image: str
    config: ImageConfig | None = None
    digest: str = ""
    error: str = ""  # the registry's answer when there is no config
    note: str = ""  # how a config was obtained when not fresh (stated in a warning)


def escape_expansion(word: str) -> str:
    """Keep a word literal through Kubernetes' ``$(VAR)`` expansion of command/args.

    The kubelet expands ``$(VAR)`` in a container's command and args, and
    ``$$`` to ``$``; image ENTRYPOINT/CMD are never expanded. Moved into the
    pod's command, they are escaped so that they still run exactly as written.
    """
    return word.replace("$", "$$")


def command_for(
    command: list[str] | None, args: list[str] | None, image: ImageConfig | None
) -> list[str] | None:
    """The argv the container runs, as the pod's ``command`` (None: unknowable without the image).

    Kubernetes' rules (containerd's ``WithProcessArgs``, docker's before it):
    a ``command`` replaces the image's ENTRYPOINT and its CMD; ``args``
    replace CMD only; an empty list counts as absent; ``ENTRYPOINT [""]``
    means none.
    """
    if command:
        return [*command, *(args or [])]
    if image is None:
        return None
    entry = list(image.entrypoint or ())
    if entry == [""]:
        entry = []
    tail = list(args) if args else [escape_expansion(w) for w in image.cmd or ()]
    return [escape_expansion(w) for w in entry] + tail


# -- lifetime ---------------------------------------------------------------------
def _owner(pod: dict[str, Any]) -> dict[str, Any] | None:
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return next((o for o in owners if o.get("controller")), owners[0] if owners else None)


def runs_to_completion(pod: dict[str, Any]) -> bool:
    owner = _owner(pod)
    if owner is None:
        return False
    group = str(owner.get("apiVersion") or "").rpartition("/")[0]
    return (group, owner.get("kind")) in RUN_TO_COMPLETION_OWNERS


def exits_with_command(pod: dict[str, Any], policy_default: str) -> bool:
    """Whether the pod ends when its command does (annotation, else the rule's default)."""
    value = annotations(pod).get(ANN_EXIT_WITH_COMMAND)
    if value is not None:
        if value not in ("true", "false"):
            raise RewriteError(f'annotation {ANN_EXIT_WITH_COMMAND} must be "true" or "false"')
        return value == "true"
    if policy_default == "always":
        return True
    if policy_default == "never":
        return False
    return runs_to_completion(pod)


# -- readiness ----------------------------------------------------------------------
def daemon_probe(port: int, path: str = "/healthz") -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": 1,
        "failureThreshold": 3,
        "timeoutSeconds": 1,
    }


def _resolve_port(port: Any, c: dict[str, Any]) -> Any:
    if isinstance(port, str) and not port.isdigit():
        for p in c.get("ports") or []:
            if p.get("name") == port:
                return p.get("containerPort")
        raise RewriteError(
            f"container {c.get('name')}: readinessProbe names port {port!r}, "
            "which the container does not declare"
        )
    return int(port) if isinstance(port, str) else port


def readiness(c: dict[str, Any], port: int) -> tuple[dict[str, Any], str | None, list[str]]:
    """(kubelet probe, the daemon's ``--readiness-probe`` JSON or None, warnings).

    Without a probe of its own, Ready means "the daemon accepts commands"
    (``/healthz``). With one, the kubelet asks the daemon's ``/readyz``, which
    is ready only when the daemon is and the original probe passes (the
    daemon runs it): the original's delay, period and thresholds are kept,
    and its timeout gets one second more for the hop through the daemon.
    """
    original = c.get("readinessProbe")
    if original is None:
        return daemon_probe(port), None, []
    handler = {k: v for k, v in original.items() if k in ("httpGet", "tcpSocket", "exec", "grpc")}
    if "grpc" in handler or not handler:
        return (
            daemon_probe(port),
            None,
            [
                f"container {c.get('name')}: a gRPC readinessProbe cannot be combined with the "
                "daemon's; it is replaced by GET /healthz (Ready = the sandbox accepts commands)"
            ],
        )
    probe = dict(original)
    for kind in ("httpGet", "tcpSocket"):
        if kind in probe:
            probe[kind] = {**probe[kind], "port": _resolve_port(probe[kind].get("port"), c)}
    kubelet: dict[str, Any] = {
        "httpGet": {"path": "/readyz", "port": port},
        "timeoutSeconds": int(original.get("timeoutSeconds") or 1) + 1,
    }
    for k in ("initialDelaySeconds", "periodSeconds", "successThreshold", "failureThreshold"):
        if original.get(k) is not None:
            kubelet[k] = original[k]
    return kubelet, json.dumps(probe, sort_keys=True, separators=(",", ":")), []


# -- scheduler --------------------------------------------------------------------
def scheduler_for(asked: str | None, choice: str, sandman_scheduler: str) -> str | None:
    """The schedulerName to write, or None to leave the pod's as it is.

    ``sandman``: pods that name no scheduler (or the default one) get
    sandman-scheduler; ``pod``: what the pod asked for; ``default``: the
    default scheduler, also for pods that named sandman-scheduler. A pod that
    names a third scheduler keeps it under every choice.
    """
    current = asked or DEFAULT_SCHEDULER
    if choice == "sandman" and current == DEFAULT_SCHEDULER:
        return sandman_scheduler
    if choice == "default" and current == sandman_scheduler:
        return DEFAULT_SCHEDULER
    return None


def facts_for(images: Mapping[str, ImageFacts] | None, image: str | None) -> ImageFacts | None:
    if images is None or image is None:
        return None
    return images.get(image)
