"""What admission reads besides the review itself: image configs and scheduler Leases.

The decisions in ``review``/``mutate`` are pure and synchronous; the facts
they need from registries (a target container without ``command``) and from
the apiserver (is the pod's scheduler running?) are fetched here first, in
the server's event loop, within the admission's time budget.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable
from typing import Any

from sandman.clock import utc_now
from sandman.contract import is_sandbox
from sandman.kube_async import KubeClient
from sandman.netguard import KNOWN_TOKEN_HOSTS, AddressRule, host_port, url_host_port
from sandman.oci import Reference, RegistryError
from sandman.registry import RegistryClient
from sandman.webhook.checks import registry_allowed
from sandman.webhook.config import WebhookConfig
from sandman.webhook.imagecache import ImageConfigCache
from sandman.webhook.imageconfig import ImageConfigResolver, PullSecrets, pull_secret_names
from sandman.webhook.lookup_rules import lookup_registry, not_named_message
from sandman.webhook.policy import RuleSet
from sandman.webhook.reinject import strip_injection
from sandman.webhook.review import PROTECTED_NAMESPACES, Review
from sandman.webhook.rewrite import DEFAULT_SCHEDULER, ImageFacts, image_to_resolve
from sandman.webhook.schedulers import SchedulerLeases


class AdmissionLookups:
    """Owns the registry client, the image cache and the Lease reads. Event-loop only."""

    def __init__(
        self, images: ImageConfigResolver | None, schedulers: SchedulerLeases | None
    ) -> None:
        self.images = images
        self.schedulers = schedulers

    @classmethod
    def build(
        cls,
        config: WebhookConfig,
        client: KubeClient,
        on_lookup: Callable[[str, float], None] | None = None,
    ) -> AdmissionLookups:
        images = None
        if config.image_config_lookup:
            images = ImageConfigResolver(
                RegistryClient(
                    insecure=config.insecure_registries,
                    endpoints=dict(config.registry_endpoints),
                    user_agent="sandman-webhook",
                    guard=address_rule(config),
                ),
                ImageConfigCache(time.monotonic, max_config_bytes=config.image_cache_bytes),
                secrets=PullSecrets(client, time.monotonic) if config.read_pull_secrets else None,
                budget_s=config.image_config_timeout_s,
                on_result=on_lookup,
            )
        schedulers = SchedulerLeases(
            client,
            dict(config.scheduler_leases),
            clock=utc_now,
            monotonic=time.monotonic,
        )
        return cls(images, schedulers)

    async def close(self) -> None:
        if self.images is not None:
            await self.images.close()

    def _admissible_sandbox(self, r: Review) -> bool:
        return (
            r.kind == "Pod"
            and r.operation == "CREATE"
            and r.namespace not in PROTECTED_NAMESPACES
            and is_sandbox(r.obj)
        )

    async def images_for(self, r: Review, rule: RuleSet) -> dict[str, ImageFacts] | None:
        """Facts for the mutation: None when lookups are off, else the images it needs.

        The pod is read as mutate() will see it (a copied injection taken out).
        The image's host is the pod author's choice, so it is looked up only
        when ``rule`` names its registry for lookups (``lookup_registry``), in
        every mode; any other image gets an error that says so, which the
        mutation treats as a failed lookup. An image whose registry ``rule``
        refuses in enforce mode gets nothing: the registry rule denies the
        pod, and a second denial would hide it."""
        if self.images is None:
            return None
        if not self._admissible_sandbox(r):
            return {}
        image = image_to_resolve(strip_injection(r.obj, []))
        if image is None:
            return {}
        if rule.mode == "enforce" and not registry_allowed(image, rule.allowed_registries):
            return {}
        if lookup_registry(image, rule.allowed_registries) is None:
            try:
                registry = Reference.parse(image).domain
            except RegistryError as e:
                return {image: ImageFacts(image, error=str(e))}
            return {image: ImageFacts(image, error=not_named_message(registry, rule.name))}
        facts = await self.images.lookup(image, r.namespace, pull_secret_names(r.obj))
        return {image: facts}

    async def scheduler_problem(self, r: Review) -> tuple[str, str] | None:
        """(scheduler, why it looks stopped) for a sandbox about to be created, else None."""
        if self.schedulers is None or not self._admissible_sandbox(r):
            return None
        spec: dict[str, Any] = r.obj.get("spec") or {}
        if spec.get("nodeName"):
            return None  # bound already: no scheduler involved
        name = spec.get("schedulerName") or DEFAULT_SCHEDULER
        problem = await self.schedulers.problem(name)
        return (name, problem) if problem else None


def address_rule(config: WebhookConfig) -> AddressRule:
    """Where the webhook's registry client may connect: public addresses, plus
    the endpoints and hosts the admin listed (``--registry-endpoint`` targets,
    ``--lookup-allow-address``), never the cluster's networks unless listed."""
    listed = {host_port(h, 443) for h in config.lookup_allow_addresses}
    for _registry, url in config.registry_endpoints:
        where = url_host_port(url)
        if where is not None:
            listed.add(where)
    tokens: dict[str, tuple[str, ...]] = dict(KNOWN_TOKEN_HOSTS)
    for registry, host in config.registry_token_hosts:
        api = Reference.parse(f"{registry}/x").api_host
        tokens[api] = (*tokens.get(api, ()), host)
    return AddressRule(
        listed=frozenset(listed),
        cluster=tuple(ipaddress.ip_network(c) for c in config.cluster_cidrs),
        token_hosts=tokens,
    )
