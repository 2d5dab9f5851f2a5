"""The offline canary: what its outcome means for the run, and the probe itself."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys

import pytest

from sandman.eval.canary import (
    ALLOW_FLAG,
    ARGV,
    Canary,
    NetworkCheck,
    NetworkUnverified,
    Verdict,
    canary_of,
    verdict,
)


@pytest.mark.parametrize(
    ("canary", "allow", "network", "refused"),
    [
        # The connection failed: the policy holds, with or without the flag.
        (Canary.BLOCKED, False, "verified", False),
        (Canary.BLOCKED, True, "verified", False),
        # It went through: nothing enforces NetworkPolicy. Refused; the flag
        # runs it anyway and says so.
        (Canary.CONNECTED, False, "unverified", True),
        (Canary.CONNECTED, True, "unverified", False),
        # It could not run (kwok nodes, a daemon that refused): unknown, same.
        (Canary.NOT_RUN, False, "unverified", True),
        (Canary.NOT_RUN, True, "unverified", False),
    ],
)
def test_verdict(canary: Canary, allow: bool, network: str, refused: bool) -> None:
    v = verdict(canary, "10.96.0.1:443 connected", allow)
    assert v.network == network and (v.refusal is not None) is refused


def test_a_refusal_says_what_was_tried_what_it_means_and_how_to_fix_it() -> None:
    why = verdict(Canary.CONNECTED, "10.96.0.1:443 connected", False).refusal
    assert why is not None
    assert "10.96.0.1:443 connected" in why and "kubernetes.default" in why  # tried
    assert "nothing in this cluster enforces NetworkPolicy" in why  # means
    assert "enforces NetworkPolicy" in why and ALLOW_FLAG in why  # fix
    why = verdict(Canary.NOT_RUN, "exit 127", False).refusal
    assert why is not None and "could not run" in why and "exit 127" in why


def test_exit_codes() -> None:
    assert canary_of(0) is Canary.CONNECTED
    assert canary_of(1) is Canary.BLOCKED
    for code in (3, 127, -1, -9):  # no target, no interpreter, refused, killed
        assert canary_of(code) is Canary.NOT_RUN


async def test_one_canary_per_run_shared_by_concurrent_offline_attempts() -> None:
    check = NetworkCheck(allow_unverified=False)
    runs = 0
    go = asyncio.Event()

    async def run() -> tuple[int, str]:
        nonlocal runs
        runs += 1
        await go.wait()
        return 1, "10.96.0.1:443 blocked: TimeoutError: timed out"

    waiting = [asyncio.ensure_future(check.verify(run)) for _ in range(5)]
    await asyncio.sleep(0)
    go.set()
    assert set(await asyncio.gather(*waiting)) == {Verdict("verified", None)}
    assert runs == 1 and check.record["network"] == "verified"
    assert check.record["canary"] == "blocked"


async def test_a_refused_run_refuses_every_offline_attempt_and_a_failed_canary_is_retried() -> None:
    check = NetworkCheck(allow_unverified=False)
    check.raise_if_refused()  # nothing known yet: not refused

    async def broken() -> tuple[int, str]:
        raise OSError("daemon went away")

    with pytest.raises(OSError):
        await check.verify(broken)
    assert check.record == {"network": "not_checked"}  # not a verdict

    async def connected() -> tuple[int, str]:
        return 0, "10.96.0.1:443 connected"

    with pytest.raises(NetworkUnverified, match="enforces NetworkPolicy"):
        await check.verify(connected)
    with pytest.raises(NetworkUnverified):
        check.raise_if_refused()  # later attempts: refused before a sandbox starts
    assert check.record["network"] == "unverified" and check.record["canary"] == "connected"


def _canary(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # The canary's code under this interpreter, as the daemon's runs it (-I -S).
    argv = [sys.executable, *ARGV[1:]]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)


def test_the_canary_connects_where_a_path_is_open_and_fails_where_not() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        open_ = _canary(
            {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(port)}
        )
    assert open_.returncode == 0 and "connected" in open_.stdout
    closed = _canary({"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(port)})
    assert closed.returncode == 1 and "blocked" in closed.stdout
    assert _canary({}).returncode == 3


async def test_a_canary_that_never_answers_is_not_run_at_the_end_of_the_run() -> None:
    async def unreachable() -> tuple[int, str]:
        raise OSError("no route to the daemon")

    # Without the flag: each try fails its attempt (retried as infrastructure);
    # at the end, an offline sandbox started but nothing answered: refused.
    check = NetworkCheck(allow_unverified=False)
    for _ in range(2):
        with pytest.raises(OSError):
            await check.verify(unreachable)
    check.finish()
    assert check.record["network"] == "unverified" and check.record["canary"] == "not_run"
    assert "no route to the daemon" in check.record["detail"]
    with pytest.raises(NetworkUnverified, match="could not run"):
        check.raise_if_refused()
    # With it: unverified at once, and the attempt goes on.
    check = NetworkCheck(allow_unverified=True)
    assert await check.verify(unreachable) == Verdict("unverified", None)
    assert check.record["canary"] == "not_run"
    # No offline sandbox ever started: nothing to claim, nothing refused.
    check = NetworkCheck(allow_unverified=False)
    check.finish()
    check.raise_if_refused()
    assert check.record == {"network": "not_checked"}
