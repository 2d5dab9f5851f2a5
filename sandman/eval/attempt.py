"""One attempt at one task, in one fresh sandbox: start, check, setup, apply, test.

Infrastructure failures are raised (the runner decides about a retry);
everything else ends in an :class:`Outcome`: scored (``pass``/``fail``) or
``error`` (the task is broken). The sandbox is always released, whatever
happened: an eval sandbox is used once.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandman.client import Sandbox, SandmanClient
from sandman.client.errors import DaemonError
from sandman.client.results import ExecResult
from sandman.contract import format_duration
from sandman.eval import canary, conditions
from sandman.eval.decide import FAIL, PASS, ConditionsNotMet, TaskBroken
from sandman.eval.pins import Pin
from sandman.eval.scoring import CommandResult, score
from sandman.eval.spec import Task
from sandman.kube_async import PODS

# Where the agent's patch is written inside the sandbox: outside the
# repository, so that it is not an untracked file of the tree under test.
PATCH_PATH = "/tmp/sandman-eval/agent.patch"
# SWE-bench's harness order: git apply, then GNU patch with fuzz for patches
# whose context drifted.
APPLY_PATCH = f"git apply --verbose {PATCH_PATH} || patch --batch --fuzz=5 -p1 -i {PATCH_PATH}"
# Each stream of a command keeps this much (the daemon allows up to 64 MiB):
# a test suite's verbose log fits; logs above it are cut and marked truncated.
MAX_OUTPUT_BYTES = 16 << 20
TAIL_CHARS = 2000  # of the deciding command's output, in the result line
# The lease of an eval sandbox: its start, its task's timeout, and this much
# for checks and release; the reaper reclaims it if the runner dies.
LEASE_MARGIN_S = 300
# How long the kubelet may take to report a running container's status after
# its daemon answered (a relist period plus a status sync, with margin).
STATUS_TIMEOUT_S = 30.0

# The SDK's start timings (Sandbox.timings), as parts of the `start` phase.
SANDBOX_PHASES = {
    "create_s": "pod_create_s",
    "schedule_s": "schedule_s",
    "start_s": "pull_start_s",
    "ready_s": "ready_s",
}

Hook = Callable[["Attempt", str], Awaitable[None]]


@dataclass
class Settings:
    """What every attempt of a run shares."""

    client: SandmanClient
    namespace: str
    run_id: str
    profile: str = conditions.PROFILE
    start_timeout_s: float = 300.0
    node_info: Callable[[str], Awaitable[dict[str, Any]]] | None = None
    hook: Hook | None = None
    clock: Callable[[], float] = time.monotonic
    network: canary.NetworkCheck | None = None  # the offline tasks' canary (canary.py)
    # The run's placement (placement.py): what is added to every pod's
    # nodeSelector, the preflight's record, whether a task on a node not
    # dedicated to the profile is an unmet condition, and how a node is judged
    # (node name, pod) -> dedicated? (None: unknown).
    node_selector: Mapping[str, str] = field(default_factory=dict)
    placement: Mapping[str, Any] = field(default_factory=dict)
    require_dedicated: bool = False
    node_dedicated: Callable[[str, Mapping[str, Any]], Awaitable[bool | None]] | None = None


@dataclass
class Attempt:
    """An attempt in progress (what a hook sees, and what a failure is blamed on)."""

    task: Task
    repeat: int
    number: int  # 1-based
    logs: Path
    phase: str = "start"
    sandbox: Sandbox | None = None
    phases: dict[str, float] = field(default_factory=dict)
    conditions: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    tails: dict[str, str] = field(default_factory=dict)
    commands: int = 0


@dataclass(frozen=True)
class Outcome:
    status: str  # pass | fail | error
    reason: str
    detail: dict[str, Any]


def _argv(cmd: tuple[str, ...] | str) -> list[str] | str:
    return cmd if isinstance(cmd, str) else list(cmd)


def pod_args(
    task: Task,
    *,
    run_id: str,
    profile: str,
    start_timeout_s: float,
    node_selector: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A task pod's settings as ``Sandbox.create`` and ``build_pod`` take them:
    the runner's preflight dry-runs the very pod the attempt creates."""
    lease = start_timeout_s + task.timeout.total_seconds() + LEASE_MARGIN_S
    return {
        "command": task.pod_command,
        "env": conditions.pod_env(task),
        "resources": conditions.resources(task),
        "profile": profile,
        "labels": conditions.pod_labels(task, run_id),
        "ttl": format_duration(dt.timedelta(seconds=lease)),
        "node_selector": dict(node_selector or {}) or None,
    }


async def _create(client: SandmanClient, body: dict[str, Any], ns: str) -> dict[str, Any]:
    # A container that restarts keeps nothing of the task but looks alive:
    # never restart, so a daemon that dies fails the attempt (and it is retried).
    body["spec"]["restartPolicy"] = "Never"
    return await client.kube.create(PODS, body, ns)  # type: ignore[no-any-return]


class Runner:
    """Runs attempts. Safe for concurrent attempts on one event loop."""

    def __init__(self, settings: Settings) -> None:
        self.s = settings

    async def run(self, a: Attempt, pin: Pin) -> Outcome:
        a.logs.mkdir(parents=True, exist_ok=True)
        t0 = self.s.clock()
        try:
            return await self._run(a, pin)
        finally:
            if a.sandbox is not None:
                t = self.s.clock()
                await a.sandbox.release()
                a.phases["release_s"] = self.s.clock() - t
            a.phases["total_s"] = self.s.clock() - t0

    async def _enter(self, a: Attempt, phase: str) -> float:
        a.phase = phase
        if self.s.hook is not None:
            await self.s.hook(a, phase)
        return self.s.clock()

    async def _run(self, a: Attempt, pin: Pin) -> Outcome:
        task, s = a.task, self.s
        offline = not task.network and s.network is not None
        if offline:
            assert s.network is not None
            s.network.raise_if_refused()  # no sandbox for a run already refused
        t = await self._enter(a, "start")
        a.sandbox = sb = await Sandbox.create(
            s.client,
            pin.image,
            namespace=s.namespace,
            **pod_args(task, run_id=s.run_id, profile=s.profile,
                       start_timeout_s=s.start_timeout_s, node_selector=s.node_selector),
            timeout_s=s.start_timeout_s,
            create_fn=lambda body, ns: _create(s.client, body, ns),
        )  # fmt: skip
        a.phases["start_s"] = s.clock() - t
        for name, value in sb.timings.phases().items():
            if name in SANDBOX_PHASES and value is not None:
                a.phases[SANDBOX_PHASES[name]] = value

        t = await self._enter(a, "check")
        checked = None
        if offline:
            # First: whether the run may go on does not depend on this pod's
            # other conditions.
            assert s.network is not None
            checked = (await s.network.verify(lambda: _canary(sb))).network
        await self._check(a, sb, pin)
        if checked is not None:
            a.conditions["network_check"] = checked
        a.phases["check_s"] = s.clock() - t

        deadline = s.clock() + task.timeout.total_seconds()
        t = await self._enter(a, "setup")
        for cmd in task.setup:
            r = await self._exec(a, sb, cmd, deadline)
            if not r.ok:
                why = "setup_timeout" if r.timed_out else "setup_failed"
                raise TaskBroken(why, f"setup command {cmd!r} exited {r.exit_code}")
        a.phases["setup_s"] = s.clock() - t

        t = await self._enter(a, "apply")
        applied = await self._apply(a, sb, deadline)
        a.phases["apply_s"] = s.clock() - t
        if applied is not None:
            return applied

        t = await self._enter(a, "test")
        results = []
        for cmd in task.test.commands:
            r = await self._exec(a, sb, cmd, deadline)
            results.append(CommandResult(r.exit_code, r.timed_out, r.stdout + "\n" + r.stderr))
            if r.timed_out:
                break
        a.phases["test_s"] = s.clock() - t
        verdict = score(task.test, results)
        return Outcome(PASS if verdict.passed else FAIL, verdict.reason, verdict.detail)

    async def _check(self, a: Attempt, sb: Sandbox, pin: Pin) -> None:
        assert pin.digest is not None
        # The daemon may answer before the kubelet reports the container
        # running: wait for the status that names the image the node ran.
        with contextlib.suppress(TimeoutError):  # check_pod names what is missing
            await sb.wait_pod(conditions.status_reported, STATUS_TIMEOUT_S)
        a.conditions = conditions.record(sb.pod, a.task)
        a.conditions["image"] = pin.image
        a.conditions["image_digest"] = pin.digest
        problems = conditions.check_pod(sb.pod, digest=pin.digest, profile=self.s.profile)
        node = a.conditions.get("node")
        if self.s.placement:
            dedicated = None
            if node and self.s.node_dedicated is not None:
                dedicated = await self.s.node_dedicated(node, sb.pod)
            a.conditions.update(
                dedicated_node=dedicated,
                placement=self.s.placement.get("verdict"),
                placement_reason=self.s.placement.get("reason", ""),
            )
            if self.s.require_dedicated and dedicated is not True:
                problems.append(
                    f"node {node} is not dedicated to profile {self.s.profile!r} "
                    f"({'unknown' if dedicated is None else 'no label or taint'}); "
                    "--require-dedicated"
                )
        if problems:
            raise ConditionsNotMet("; ".join(problems))
        status = await sb.status()
        a.versions["daemon"] = status.get("version")
        a.versions["sandman_injected"] = a.conditions.pop("sandman_injected")
        if node and self.s.node_info is not None:
            a.versions.update(await self.s.node_info(node))

    async def _apply(self, a: Attempt, sb: Sandbox, deadline: float) -> Outcome | None:
        """None when the agent's output is in place; else the (scored) failure."""
        ap, cwd = a.task.apply, a.task.workdir
        if ap.kind == "none":
            return None
        if ap.kind == "files":
            for path, text in ap.files:
                if not path.startswith("/") and not cwd:
                    raise TaskBroken("bad_spec", f"relative path {path!r} needs a workdir")
                full = path if path.startswith("/") else f"{cwd.rstrip('/')}/{path}"  # type: ignore[union-attr]
                error = await _write(sb, full, text)
                if error:
                    return Outcome(FAIL, "apply_failed", {"file": path, "error": error})
            return None
        if ap.kind == "patch":
            error = await _write(sb, PATCH_PATH, ap.patch or "")
            if error:
                raise TaskBroken("patch_not_written", f"{PATCH_PATH}: {error}")
            cmd: tuple[str, ...] | str = APPLY_PATCH
        else:
            cmd = ap.command  # type: ignore[assignment]
        r = await self._exec(a, sb, cmd, deadline)
        if r.timed_out:
            return Outcome(FAIL, "timeout", {"phase": "apply"})
        if r.exit_code != 0:
            return Outcome(FAIL, "apply_failed", {"exit_code": r.exit_code})
        return None

    async def _exec(
        self, a: Attempt, sb: Sandbox, cmd: tuple[str, ...] | str, deadline: float
    ) -> ExecResult:
        left = deadline - self.s.clock()
        if left <= 0:
            return ExecResult(
                -9, b"", b"task timeout reached before this command\n", True, False, 0
            )
        try:
            r = await sb.exec(
                _argv(cmd),
                cwd=a.task.workdir,
                env=conditions.pod_env(a.task),
                timeout_s=left,
                max_output_bytes=MAX_OUTPUT_BYTES,
            )
        except DaemonError as e:
            if e.status >= 500 or e.status == 401:
                raise  # the daemon's fault: an infrastructure failure
            raise TaskBroken(f"daemon_{e.code}", e.message) from None
        a.commands += 1
        _save(a, cmd, r)
        return r


async def _canary(sb: Sandbox) -> tuple[int, str]:
    """(exit code, output) of the network canary; a refusal by the daemon is
    "could not run" (-1), its failure an infrastructure one (raised)."""
    try:
        r = await sb.exec(canary.ARGV, timeout_s=canary.EXEC_TIMEOUT_S, max_output_bytes=4096)
    except DaemonError as e:
        if e.status >= 500 or e.status == 401:
            raise
        return -1, f"the daemon refused the canary: {e.code}: {e.message}"
    return r.exit_code, (r.stdout + r.stderr) if not r.timed_out else "timed out"


async def _write(sb: Sandbox, path: str, text: str) -> str:
    """Write a file; the daemon's refusal (4xx) as text, "" when written."""
    try:
        await sb.write_file(path, text)
    except DaemonError as e:
        if e.status >= 500 or e.status == 401:
            raise
        return f"{e.code}: {e.message}"
    return ""


def _save(a: Attempt, cmd: tuple[str, ...] | str, r: ExecResult) -> None:
    stem = a.logs / f"{a.commands:02d}-{a.phase}"
    stem.with_suffix(".stdout").write_bytes(r.stdout_bytes)
    stem.with_suffix(".stderr").write_bytes(r.stderr_bytes)
    entry: Mapping[str, Any] = {
        "n": a.commands, "phase": a.phase, "cmd": _argv(cmd), "exit_code": r.exit_code,
        "timed_out": r.timed_out, "truncated": r.truncated, "duration_ms": r.duration_ms,
    }  # fmt: skip
    with (a.logs / "commands.jsonl").open("a") as f:
        f.write(json.dumps(entry) + "\n")
    a.tails = {"stdout": r.stdout[-TAIL_CHARS:], "stderr": r.stderr[-TAIL_CHARS:]}
