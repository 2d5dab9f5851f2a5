"""ENTRYPOINT/CMD lookups inside admission: budget, cache, one fetch per image, pull secrets.

The mutating webhook needs the image's ENTRYPOINT and CMD when a sandbox's
target container has no ``command`` (Tekton's controller resolves step
entrypoints the same way). This module does the I/O around the pure cache:

- a **budget** per admission (``--image-config-timeout``, 3 s of the
  webhook's 5 s ``timeoutSeconds``): an answer not in by then is a failure
  the mutation turns into a denial (enforce) or a warning, never a guess;
- **one fetch per image and login**, shared by every admission waiting for
  it, and left running when one admission's budget ends (for
  ``BACKGROUND_GRACE_S`` more), so that the controller's retry finds the
  answer in the cache;
- **bounds**: lookups in flight per registry host, per namespace and in
  total, and a rest for a host that did not answer (``lookup_limits``), so
  that one namespace's lookups cannot starve another's;
- **no read-back**: a pod is told a fixed reason (``lookup_rules``); what
  the registry said is logged here only;
- the pod's **imagePullSecrets** (the ServiceAccount admission plugin has
  already copied the ServiceAccount's into the pod when it named none), read
  only with ``--read-pull-secrets`` (it needs ``get`` on Secrets).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from sandman.kube_async import SECRETS, ApiError, KubeClient
from sandman.oci import Reference, RegistryError, ResolvedImage
from sandman.registry import RegistryClient
from sandman.registry_auth import AuthConfigError, Keychain
from sandman.webhook.imagecache import ImageConfigCache
from sandman.webhook.lookup_limits import HOST_REST_S, HostFailures, InFlight, Limits
from sandman.webhook.lookup_rules import HOST_FAILURE_REASONS, failure_message, failure_reason
from sandman.webhook.rewrite import ImageFacts

log = logging.getLogger("sandman.webhook")

# 3 s of the webhook's 5 s timeoutSeconds: a remote registry needs up to five
# sequential requests (token, index, manifest, config; ~100-300 ms each), and
# the remaining 2 s cover the apiserver's hop and queueing under a burst.
LOOKUP_BUDGET_S = 3.0
# A fetch still running when its admission's budget ends goes on for 2 s
# more, so that the controller's retry (typically within a second or two)
# finds the answer cached; longer would let a registry that never answers
# hold a connection and an in-flight slot per tag for 10 s per request.
BACKGROUND_GRACE_S = 2.0
# Pull secrets change rarely; 30 s keeps a burst of pods to one GET per
# secret while a rotated secret is used half a minute later.
SECRET_TTL_S = 30.0


class PullSecrets:
    """Keychains from pull secrets, cached per secret. Event-loop only.

    Exists so that a burst of pods naming one secret costs one GET, and so
    that a missing or forbidden secret is skipped as the kubelet skips it
    (the registry then answers for itself) instead of failing the lookup.
    """

    def __init__(
        self, client: KubeClient, clock: Callable[[], float], ttl_s: float = SECRET_TTL_S
    ) -> None:
        self.client = client
        self.clock = clock
        self.ttl_s = ttl_s
        self._cache: dict[tuple[str, str], tuple[Keychain, float]] = {}
        self._forbidden_logged = False

    async def keychain(self, namespace: str, names: Sequence[str]) -> Keychain:
        return Keychain.merge([await self._one(namespace, n) for n in names])

    async def _one(self, namespace: str, name: str) -> Keychain:
        hit = self._cache.get((namespace, name))
        if hit is not None and self.clock() < hit[1]:
            return hit[0]
        chain = Keychain()
        try:
            chain = Keychain.from_secret(await self.client.get(SECRETS, name, namespace))
        except ApiError as e:
            if e.status == 403 and not self._forbidden_logged:
                self._forbidden_logged = True
                log.warning(
                    "cannot read pull secrets (HTTP 403): grant the webhook `get secrets` "
                    "(manifests/webhook/rbac-pull-secrets.yaml) or drop --read-pull-secrets"
                )
            elif e.status not in (403, 404):
                log.warning("pull secret %s/%s: HTTP %s", namespace, name, e.status)
        except AuthConfigError as e:
            log.info("pull secret skipped: %s", e)
        except (aiohttp.ClientError, TimeoutError) as e:
            # The apiserver did not answer: lookup without it, and ask again next time.
            log.warning("pull secret %s/%s unread: %s", namespace, name, e)
            return chain
        if len(self._cache) > 4096:  # a namespace per test run: keep it bounded
            self._cache.clear()
        self._cache[(namespace, name)] = (chain, self.clock() + self.ttl_s)
        return chain


class ImageConfigResolver:
    """Looks up image configs for admission. Event-loop only; ``close()`` when done.

    Bounded so that one namespace's lookups cannot starve another's: lookups
    in flight are counted per registry host, per namespace and in total
    (``InFlight``; over a bound a lookup fails at once), a fetch left running
    past its admission's budget gets ``grace_s`` more and is then cancelled,
    and a host that timed out or could not be reached rests (``HostFailures``).
    What a registry answered is logged here; pods see only a fixed reason."""

    def __init__(
        self,
        registry: RegistryClient,
        cache: ImageConfigCache,
        *,
        secrets: PullSecrets | None = None,
        budget_s: float = LOOKUP_BUDGET_S,
        grace_s: float = BACKGROUND_GRACE_S,
        limits: Limits | None = None,
        host_rest_s: float = HOST_REST_S,
        on_result: Callable[[str, float], None] | None = None,
    ) -> None:
        self.registry = registry
        self.cache = cache
        self.secrets = secrets
        self.budget_s = budget_s
        self.grace_s = grace_s
        self.on_result = on_result or (lambda _result, _seconds: None)
        self.inflight = InFlight(limits or Limits())
        self.host_failures = HostFailures(cache.clock, host_rest_s)
        self._fetches: dict[tuple[str, str], asyncio.Task[ImageFacts]] = {}

    async def close(self) -> None:
        for t in list(self._fetches.values()):
            t.cancel()
        await asyncio.gather(*self._fetches.values(), return_exceptions=True)
        await self.registry.close()

    async def lookup(self, image: str, namespace: str, pull_secrets: Sequence[str]) -> ImageFacts:
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(self.budget_s):
                facts, result = await self._lookup(image, namespace, pull_secrets)
        except TimeoutError:
            facts, result = (
                ImageFacts(image, error=f"no answer within {self.budget_s:g}s"),
                "timeout",
            )
            try:
                ref = Reference.parse(image)
            except RegistryError:
                pass
            else:
                why = failure_message(
                    ref.domain, f"timed out (no answer within {self.budget_s:g}s)"
                )
                # the login is unknown here; only an anonymous entry may be reused
                facts = self._stale_or(image, ref, "anonymous", why, True)
        self.on_result(result, time.monotonic() - t0)
        return facts

    async def _lookup(
        self, image: str, namespace: str, pull_secrets: Sequence[str]
    ) -> tuple[ImageFacts, str]:
        try:
            ref = Reference.parse(image)
        except RegistryError as e:
            # the pod's own text, not a registry's: safe to say back
            return ImageFacts(image, error=str(e)), "error"
        keychain = Keychain()
        if self.secrets is not None and pull_secrets:
            keychain = await self.secrets.keychain(namespace, pull_secrets)
        creds = keychain.lookup(ref.domain, ref.path)
        cred = creds[0].ident if creds else "anonymous"
        hit = self.cache.get(ref, cred)
        if hit is not None:
            return ImageFacts(image, hit.config, digest=hit.digest), "hit"
        failed = self.cache.failure(ref, cred)
        if failed is not None:
            return self._stale_or(image, ref, cred, *failed), "error"
        key = (str(ref), cred)
        task = self._fetches.get(key)
        if task is None:
            resting = self.host_failures.resting(ref.domain)
            if resting is not None:
                why = failure_message(ref.domain, f"{resting} (a moment ago; not asked again yet)")
                return self._stale_or(image, ref, cred, why, True), "error"
            busy = self.inflight.start(ref.domain, namespace)
            if busy is not None:
                why = failure_message(ref.domain, f"busy ({busy}); retry in a few seconds")
                return self._stale_or(image, ref, cred, why, True), "error"
            task = asyncio.ensure_future(self._fetch(image, ref, keychain, cred))
            self._fetches[key] = task

            def done(_t: asyncio.Task[ImageFacts], host: str = ref.domain) -> None:
                self._fetches.pop(key, None)
                self.inflight.end(host, namespace)

            task.add_done_callback(done)
        # shield: one admission running out of budget must not cancel the
        # fetch the others (and the retry) are waiting for.
        facts = await asyncio.shield(task)
        return facts, "error" if facts.error else "miss"

    async def _fetch(self, image: str, ref: Reference, keychain: Keychain, cred: str) -> ImageFacts:
        try:
            # The admission's budget, plus a little for the retry to find the
            # answer in the cache; then the slot is given back.
            async with asyncio.timeout(self.budget_s + self.grace_s):
                got = await self._read(ref, keychain, cred)
        except (RegistryError, TimeoutError, RecursionError) as e:
            reason = failure_reason(e)
            log.info("image config lookup of %s failed (%s): %s", ref, reason, e)
            if reason in HOST_FAILURE_REASONS:
                self.host_failures.failed(ref.domain, reason)
            retryable = isinstance(e, TimeoutError) or getattr(e, "retryable", False)
            why = failure_message(ref.domain, reason)
            self.cache.remember_failure(ref, cred, why, retryable)
            return self._stale_or(image, ref, cred, why, retryable)
        if isinstance(got, str):
            cfg = self.cache.config_for(ref, got, cred)
            assert cfg is not None
            return ImageFacts(image, cfg, digest=got)
        self.cache.remember(ref, cred, got.digest, got.config)
        return ImageFacts(image, got.config, digest=got.digest)

    async def _read(self, ref: Reference, keychain: Keychain, cred: str) -> ResolvedImage | str:
        """The image's config from the registry, or the digest of an unmoved tag
        whose config the cache holds."""
        if self.cache.stale_digest(ref, cred) is not None:
            # A tag resolved before: one HEAD tells whether it moved, and
            # the config of an unmoved tag is still in the cache.
            digest = await self.registry.resolve_digest(ref, keychain=keychain)
            if self.cache.config_for(ref, digest, cred) is not None:
                self.cache.remember_digest(ref, cred, digest)
                return digest
        return await self.registry.image_config(ref, keychain=keychain)

    def _stale_or(
        self, image: str, ref: Reference, cred: str, error: str, retryable: bool
    ) -> ImageFacts:
        """The last config the tag named when the registry is down or slow (stated
        in a warning), since nodes that cached the image still run it; a
        definitive answer (no such image, credentials refused) is never papered over."""
        stale = self.cache.stale(ref, cred) if retryable else None
        if stale is None:
            return ImageFacts(image, error=error)
        note = (
            f"its registry failed ({error}); used the ENTRYPOINT/CMD last read for {stale.digest}"
        )
        return ImageFacts(image, stale.config, digest=stale.digest, note=note)


def pull_secret_names(pod: dict[str, Any]) -> list[str]:
    """The pull secrets a pod names (as the kubelet reads them)."""
    return [
        str(s["name"])
        for s in (pod.get("spec") or {}).get("imagePullSecrets") or []
        if isinstance(s, dict) and s.get("name")
    ]
