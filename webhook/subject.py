"""What every policy check reads (pure): the pod, its rule set, the trusted images."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sandman.contract import annotations
from sandman.webhook.policy import RuleSet, Violation


def security_context(c: dict[str, Any]) -> dict[str, Any]:
    return c.get("securityContext") or {}


@dataclass(frozen=True)
class Subject:
    """What every check reads: the pod, the rule set that governs it, and the
    images trusted whatever the registries (the injected daemon's)."""

    pod: dict[str, Any]
    rule: RuleSet
    trusted_images: frozenset[str] = frozenset()
    # The daemon's shared node directory when that mode is on (the webhook
    # mounts it read-only into the sandbox); nothing else on the host.
    trusted_host_paths: frozenset[str] = frozenset()

    @property
    def spec(self) -> dict[str, Any]:
        return self.pod.get("spec") or {}

    @property
    def containers(self) -> list[dict[str, Any]]:
        """Every container that runs code: init, app and ephemeral (kubectl debug)."""
        spec = self.spec
        return [
            *(spec.get("initContainers") or []),
            *(spec.get("containers") or []),
            *(spec.get("ephemeralContainers") or []),
        ]

    @property
    def security_contexts(self) -> list[tuple[str, dict[str, Any]]]:
        """(who, securityContext) for the pod and every container."""
        out = [("the pod", self.spec.get("securityContext") or {})]
        out += [(f"container {c.get('name', '?')}", security_context(c)) for c in self.containers]
        return out

    @property
    def annotations(self) -> dict[str, str]:
        return annotations(self.pod)


Check = Callable[[Subject], Iterator[Violation]]
