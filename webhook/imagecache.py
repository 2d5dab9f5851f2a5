"""What the webhook remembers about images: tag -> digest, digest -> config, failures (pure).

Admission has seconds, a registry round trip costs tens to hundreds of
milliseconds, and a burst of a thousand pods names one image a thousand
times: without a cache, each pod would wait for the same answers, and a
registry's rate limit would turn the burst into denials. Content named by a
digest never changes, so digest -> config entries never expire (they are
only evicted, least recently used first); a tag can move, so tag -> digest
entries live ``tag_ttl_s``. Failures are remembered briefly so that a
controller retrying a denied pod does not wait out the budget every time.

Entries are per login (``cred``): an image read with one namespace's pull
secret is never answered from the cache to a pod that has no such secret.
Not thread-safe; the webhook uses it from its event loop only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sandman.oci import ImageConfig, Reference

# 30 s: a burst of pods (thousands within seconds) shares one resolution, and
# a re-pushed tag is seen half a minute later. The kubelet is staler still
# (with IfNotPresent a node keeps running the copy it pulled long ago), so
# pods that must run one exact image name it by digest.
TAG_TTL_S = 30.0
# 5 s: long enough to answer a controller's immediate retry at once, short
# enough that a registry back from a blip (or a just-pushed image) is seen
# on the next try a person makes.
FAILURE_TTL_S = 5.0
# An entry is a few hundred bytes (argv, workdir, user, env); 4,096 covers
# every image a large RL job names (one per task) at a few MB.
MAX_ENTRIES = 4096


@dataclass(frozen=True)
class Hit:
    digest: str
    config: ImageConfig


class ImageConfigCache:
    """Bounded LRU maps with an injected clock (seconds, monotonic)."""

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        tag_ttl_s: float = TAG_TTL_S,
        failure_ttl_s: float = FAILURE_TTL_S,
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        self.clock = clock
        self.tag_ttl_s = tag_ttl_s
        self.failure_ttl_s = failure_ttl_s
        self.max_entries = max_entries
        self._tags: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()
        self._configs: OrderedDict[tuple[str, str], ImageConfig] = OrderedDict()
        self._failures: OrderedDict[tuple[str, str], tuple[str, bool, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._configs)

    @staticmethod
    def _tag_key(ref: Reference) -> str:
        return f"{ref.name}:{ref.tag or 'latest'}"

    def _put(self, m: OrderedDict[Any, Any], key: Any, value: Any) -> None:
        m[key] = value
        m.move_to_end(key)
        while len(m) > self.max_entries:
            m.popitem(last=False)

    # -- reads --------------------------------------------------------------------
    def digest_for(self, ref: Reference, cred: str) -> str | None:
        """The digest ``ref`` named within ``tag_ttl_s``, or the digest it carries."""
        if ref.digest:
            return ref.digest
        hit = self._tags.get((self._tag_key(ref), cred))
        if hit is None or self.clock() >= hit[1]:
            return None
        return hit[0]

    def stale_digest(self, ref: Reference, cred: str) -> str | None:
        """The digest a tag named when last resolved, however long ago (kept until
        evicted): one HEAD then tells whether the config in the cache still applies."""
        hit = self._tags.get((self._tag_key(ref), cred))
        return hit[0] if hit is not None else None

    def config_for(self, ref: Reference, digest: str, cred: str) -> ImageConfig | None:
        key = (f"{ref.name}@{digest}", cred)
        cfg = self._configs.get(key)
        if cfg is not None:
            self._configs.move_to_end(key)
        return cfg

    def get(self, ref: Reference, cred: str) -> Hit | None:
        """The config of what ``ref`` names, without asking the registry (or None)."""
        digest = self.digest_for(ref, cred)
        if digest is None:
            return None
        cfg = self.config_for(ref, digest, cred)
        return Hit(digest, cfg) if cfg is not None else None

    def failure(self, ref: Reference, cred: str) -> tuple[str, bool] | None:
        """(message, retryable) of a lookup that failed within ``failure_ttl_s``."""
        key = (str(ref), cred)
        hit = self._failures.get(key)
        if hit is None:
            return None
        if self.clock() >= hit[2]:
            del self._failures[key]
            return None
        return hit[0], hit[1]

    def stale(self, ref: Reference, cred: str) -> Hit | None:
        """The config a tag named when last resolved, however long ago: what the
        webhook falls back on while the registry cannot be reached."""
        digest = self.stale_digest(ref, cred)
        cfg = self.config_for(ref, digest, cred) if digest else None
        return Hit(digest, cfg) if digest and cfg is not None else None

    # -- writes -------------------------------------------------------------------
    def remember_digest(self, ref: Reference, cred: str, digest: str) -> None:
        if not ref.digest:
            self._put(
                self._tags, (self._tag_key(ref), cred), (digest, self.clock() + self.tag_ttl_s)
            )

    def remember(self, ref: Reference, cred: str, digest: str, config: ImageConfig) -> None:
        self.remember_digest(ref, cred, digest)
        self._put(self._configs, (f"{ref.name}@{digest}", cred), config)
        self._failures.pop((str(ref), cred), None)

    def remember_failure(
        self, ref: Reference, cred: str, message: str, retryable: bool = False
    ) -> None:
        expires = self.clock() + self.failure_ttl_s
        self._put(self._failures, (str(ref), cred), (message, retryable, expires))
