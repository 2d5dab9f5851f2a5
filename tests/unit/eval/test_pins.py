"""Pinning images: resolution with retries, and a moved tag noticed (against a
loopback registry serving the distribution API)."""

from __future__ import annotations

from sandman.eval import pins
from sandman.eval.decide import Failure, classify, retry, retry_backoff_s
from sandman.oci import ImageNotFound, RegistryUnreachable, Unauthorized
from sandman.registry import RegistryClient
from tests.unit.registry.fake import FakeRegistry


def test_pure_decisions() -> None:
    assert pins.pinned_ref("r/x:1", "sha256:a") == "r/x:1@sha256:a"
    assert pins.pinned_ref("r/x:1@sha256:b", "sha256:b") == "r/x:1@sha256:b"
    p = pins.Pin("r/x:1", "sha256:a", 1)
    assert not pins.moved(p, "sha256:a") and pins.moved(p, "sha256:b")
    # backoff: 1, 2, 4, 8, then capped at 10 s
    assert [pins.backoff_s(n) for n in (1, 2, 3, 4, 5)] == [1.0, 2.0, 4.0, 8.0, 10.0]
    assert pins.retry_resolution(ImageNotFound("x")) and pins.retry_resolution(
        RegistryUnreachable("x")
    )
    assert not pins.retry_resolution(Unauthorized("x"))


async def test_resolve_pins_found_missing_and_digest_refs() -> None:
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    async with FakeRegistry() as reg, RegistryClient() as rc:
        digest = reg.add_image("team/app", "1", {"Cmd": ["x"]})
        have, gone = f"{reg.host}/team/app:1", f"{reg.host}/team/missing:1"
        pinned = f"{reg.host}/team/app:1@{digest}"
        got = await pins.resolve(rc, [have, gone, pinned, have], attempts=3, sleep=sleep)
        assert got[have] == pins.Pin(have, digest, 1)
        assert got[pinned].digest == digest and got[pinned].attempts == 0  # no request at all
        # missing: 3 attempts, backoff 1 s then 2 s in between, then a pin without digest
        miss = got[gone]
        assert miss.digest is None and miss.attempts == 3 and miss.reason == "ImageNotFound"
        assert slept == [1.0, 2.0]
        assert await pins.still_pinned(rc, got[have]) is None
        moved_to = reg.add_image("team/app", "1", {"Cmd": ["y"]})  # the tag moves
        assert await pins.still_pinned(rc, got[have]) == moved_to != digest
        assert await pins.still_pinned(rc, got[pinned]) is None  # a digest cannot move


def test_failure_classification_and_retries() -> None:
    from sandman.client.errors import DaemonError, SandboxStartError, TransportError
    from sandman.eval.decide import ConditionsNotMet, TagMoved

    assert classify(TransportError("reset")) == Failure("Unreachable", "reset", True)
    start = classify(SandboxStartError("ImageNotFound", "gone", retryable=False))
    assert start is not None and start.reason == "ImageNotFound" and not start.retryable
    assert classify(DaemonError(503, "stopping", "x")) is not None  # the daemon's fault
    assert classify(DaemonError(400, "bad_request", "x")) is None  # the task's: not infra
    assert classify(TagMoved("moved")) == Failure("TagMoved", "moved", False)
    assert classify(ConditionsNotMet("qos")).reason == "ConditionsNotMet"  # type: ignore[union-attr]
    f = Failure("Unreachable", "", True)
    assert retry(f, 1, 3) and retry(f, 2, 3) and not retry(f, 3, 3)
    assert not retry(Failure("TagMoved", "", False), 1, 3)
    assert [retry_backoff_s(n) for n in (1, 2, 3, 4)] == [2.0, 4.0, 8.0, 15.0]
