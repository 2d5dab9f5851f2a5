"""Images pinned by digest: tags resolved once per run, a moved tag refused.

A tag is a name someone can point elsewhere between two runs, or in the
middle of one; a score is only reproducible when every task ran the content
its run pinned. So the run resolves each image reference once, before any
task starts, runs ``ref@digest`` (the kubelet pulls exactly that), checks
the tag again before each task and refuses the task when it moved: its
benchmark is no longer what the run started with.

The decisions (``pinned_ref``, ``moved``, ``retry_resolution``) are pure;
``resolve`` and ``still_pinned`` talk to the registry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from sandman.oci import ImageNotFound, Reference, RegistryError
from sandman.registry import Keychain, RegistryClient

Sleep = Callable[[float], Awaitable[None]]
# Between resolution attempts: 1 s, 2 s, 4 s... (at most 10 s): long enough
# for a registry's storage to show a manifest pushed a moment ago (an S3-backed
# distribution answers 404 for a few seconds after a push), short enough that
# a reference that really is missing costs seconds, not minutes.
BACKOFF_S = 1.0
BACKOFF_MAX_S = 10.0


@dataclass(frozen=True)
class Pin:
    ref: str  # as the spec wrote it
    digest: str | None  # None: could not be resolved
    attempts: int  # registry calls it took
    error: str = ""  # why it could not be resolved
    reason: str = ""  # ImageNotFound | RegistryUnreachable | Unauthorized | ...
    retryable: bool = False

    @property
    def image(self) -> str:
        """What the pod runs: the reference with its digest."""
        assert self.digest is not None
        return pinned_ref(self.ref, self.digest)


def pinned_ref(ref: str, digest: str) -> str:
    """``repo:tag`` -> ``repo:tag@digest`` (a ref that names a digest stays as it is)."""
    return ref if "@" in ref else f"{ref}@{digest}"


def moved(pin: Pin, now: str) -> bool:
    return pin.digest is not None and now != pin.digest


def backoff_s(attempt: int) -> float:
    """Pause after failed attempt number ``attempt`` (1-based)."""
    return float(min(BACKOFF_S * 2 ** (attempt - 1), BACKOFF_MAX_S))


def retry_resolution(e: RegistryError) -> bool:
    """Whether another try may resolve it: an unreachable registry, or a
    manifest that may not be visible yet (see BACKOFF_S); never a refusal
    (credentials) or a malformed reference."""
    return e.retryable or isinstance(e, ImageNotFound)


async def resolve(
    registry: RegistryClient,
    refs: Iterable[str],
    *,
    attempts: int,
    keychain: Keychain | None = None,
    sleep: Sleep = asyncio.sleep,
) -> dict[str, Pin]:
    """Each distinct reference to its digest now, in parallel; failures are
    kept as pins without a digest (their tasks cannot be scored)."""

    async def one(ref: str) -> Pin:
        if Reference.parse(ref).digest:
            return Pin(ref, Reference.parse(ref).digest, 0)
        for n in range(1, attempts + 1):
            try:
                return Pin(ref, await registry.resolve_digest(ref, keychain=keychain), n)
            except RegistryError as e:
                last = Pin(ref, None, n, str(e), type(e).__name__, retry_resolution(e))
                if not last.retryable or n == attempts:
                    return last
                await sleep(backoff_s(n))
        raise AssertionError("attempts must be >= 1")

    unique = sorted(set(refs))
    return dict(zip(unique, await asyncio.gather(*(one(r) for r in unique)), strict=True))


async def still_pinned(
    registry: RegistryClient, pin: Pin, *, keychain: Keychain | None = None
) -> str | None:
    """None when ``pin.ref`` still names the pinned digest, else what it names now.

    An unreachable registry is raised (RegistryError): the caller decides
    whether that is worth a retry.
    """
    if pin.digest is None or "@" in pin.ref:
        return None
    now = await registry.resolve_digest(pin.ref, keychain=keychain)
    return now if moved(pin, now) else None
