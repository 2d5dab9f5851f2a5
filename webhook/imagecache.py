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

Configs are bounded twice: by count (``max_entries``) and by an estimate of
their bytes (``max_config_bytes``, ``config_cost``). The count alone let a
few hostile images with multi-MB configs hold hundreds of MB (entries that
never expire), until the replica was OOM-killed and every sandbox create
failed; ``ImageConfig`` now keeps only bounded argv and WORKDIR, and the
byte budget holds whatever the entries weigh.
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
# An entry is a few hundred bytes (argv and workdir); 4,096 covers every
# image a large RL job names (one per task) at a few MB.
MAX_ENTRIES = 4096
# 16 MiB: 4,096 real entries (~1 KB each by ``config_cost``) fit four times
# over, and 200 entries at the caps of ``sandman.oci`` (~80 KB each) still
# fit; a replica's limit is 512 MiB, so the cache can never be what kills it.
MAX_CONFIG_BYTES = 16 << 20
# CPython's size of a str header plus its slot in a tuple (sys.getsizeof("")
# is 49, the slot 8), rounded up: an argv of empty words is not free.
WORD_OVERHEAD = 64
# The entry's dataclass, its tuples, the OrderedDict node and key tuple.
ENTRY_OVERHEAD = 512


def config_cost(key: str, config: ImageConfig) -> int:
    """Estimated bytes one cached config holds (pure): its words and key as UTF-8
    plus a fixed overhead per word and per entry."""
    words = (*(config.entrypoint or ()), *(config.cmd or ()), config.working_dir, key)
    text = sum(len(w.encode("utf-8", "surrogatepass")) for w in words)
    return ENTRY_OVERHEAD + WORD_OVERHEAD * len(words) + text


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
        max_config_bytes: int = MAX_CONFIG_BYTES,
    ) -> None:
        self.clock = clock
        self.tag_ttl_s = tag_ttl_s
        self.failure_ttl_s = failure_ttl_s
        self.max_entries = max_entries
        self.max_config_bytes = max_config_bytes
        self._tags: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()
        # key -> (config, config_cost); config_bytes is the sum of the costs
        self._configs: OrderedDict[tuple[str, str], tuple[ImageConfig, int]] = OrderedDict()
        self.config_bytes = 0
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
        hit = self._configs.get(key)
        if hit is None:
            return None
        self._configs.move_to_end(key)
        return hit[0]

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
        self._put_config((f"{ref.name}@{digest}", cred), config)
        self._failures.pop((str(ref), cred), None)

    def _put_config(self, key: tuple[str, str], config: ImageConfig) -> None:
        """Insert as most recently used, then evict the least recently used until
        both the count and the byte budget hold. An entry over the whole budget is
        not kept (the lookup that fetched it still answers with it)."""
        old = self._configs.pop(key, None)
        if old is not None:
            self.config_bytes -= old[1]
        cost = config_cost(key[0], config)
        if cost > self.max_config_bytes:
            return
        self._configs[key] = (config, cost)
        self.config_bytes += cost
        while len(self._configs) > self.max_entries or self.config_bytes > self.max_config_bytes:
            _k, (_c, evicted) = self._configs.popitem(last=False)
            self.config_bytes -= evicted

    def remember_failure(
        self, ref: Reference, cred: str, message: str, retryable: bool = False
    ) -> None:
        expires = self.clock() + self.failure_ttl_s
        self._put(self._failures, (str(ref), cred), (message, retryable, expires))
