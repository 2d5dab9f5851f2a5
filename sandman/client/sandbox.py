"""A sandbox: an ordinary labeled pod, and a typed handle on its daemon."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from sandman.client import podwatch, reuse, startup
from sandman.client import pty as pty_mod
from sandman.client.bounded import (
    MAX_ERROR_BYTES,
    MAX_FILE_BYTES,
    MAX_JSON_BYTES,
    loads,
    read_bounded,
    read_prefix,
)
from sandman.client.client import UNSET, SandmanClient
from sandman.client.edges import sdk_errors
from sandman.client.errors import (
    DaemonError,
    ProtocolError,
    ResponseTooLarge,
    SandboxGone,
    SandboxStartError,
    StreamAborted,
    TransportError,
    Unauthorized,
    WaitTimeout,
)
from sandman.client.results import ExecResult, Process, Session, decode_output
from sandman.client.transport import DaemonRequest, DaemonResponse, Target
from sandman.contract import (
    ANN_EXPIRES_AT,
    ANN_IDLE_TIMEOUT,
    ANN_KEY_ID,
    ANN_PROFILE,
    ANN_TTL,
    ANN_WORKSPACE,
    LABEL_ID,
    LABEL_SANDBOX,
    STREAM_ERROR_MARKER,
    annotations,
    format_time,
    parse_duration,
)
from sandman.kube_async import JSON_PATCH, PODS, ApiError

DEFAULT_TIMEOUT_S = 600.0
# How long "no node fits" is tolerated before it fails the start: long enough
# for a finishing rollout to free room in a busy batch, short enough that a
# request nobody can ever satisfy fails in well under a minute.
UNSCHEDULABLE_GRACE = dt.timedelta(seconds=30)
# How often a starting sandbox's daemon is asked directly whether it is ready,
# once its container may run. A refused connection costs a round trip on the
# pod network; 50 ms keeps that under ~20 requests per start while adding at
# most 50 ms to it (the kubelet's own probe runs every second at best).
DAEMON_POLL_S = 0.05


@dataclass
class Timings:
    """Client-observed instants (time.monotonic) of a sandbox's start."""

    requested: float = 0.0
    created: float | None = None
    scheduled: float | None = None
    started: float | None = None
    ready: float | None = None
    first_result: float | None = None

    def phases(self) -> dict[str, float | None]:
        def d(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else b - a

        return {
            "create_s": d(self.requested, self.created),
            "schedule_s": d(self.created, self.scheduled),
            "start_s": d(self.scheduled, self.started),  # pull + container start
            "ready_s": d(self.started, self.ready),
            "first_command_s": d(self.ready, self.first_result),
            "ttfc_s": d(self.requested, self.first_result),
        }


def build_pod(
    image: str,
    *,
    name: str | None,
    command: Sequence[str] | None,
    env: Mapping[str, str],
    resources: Mapping[str, Any] | None,
    ttl: str | None,
    idle_timeout: str | None,
    profile: str | None,
    workspace: str | None,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    node_selector: Mapping[str, str] | None,
    tolerations: Sequence[Mapping[str, Any]] | None,
) -> dict[str, Any]:
    ann = dict(annotations)
    for key, value in (
        (ANN_TTL, ttl),
        (ANN_IDLE_TIMEOUT, idle_timeout),
        (ANN_PROFILE, profile),
        (ANN_WORKSPACE, workspace),
    ):
        if value:
            ann[key] = value
    container: dict[str, Any] = {"name": "main", "image": image}
    if command:
        container["command"] = list(command)
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    if resources:
        container["resources"] = dict(resources)
    md: dict[str, Any] = {"labels": {**labels, LABEL_SANDBOX: "true"}, "annotations": ann}
    if name:
        md["name"] = name
    else:
        md["generateName"] = "sandbox-"
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 5}
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": spec}


class Sandbox:
    """One sandbox. Safe for concurrent calls from tasks of one event loop (the
    daemon serialises what must be serial, e.g. runs of one session)."""

    def __init__(self, client: SandmanClient, pod: dict[str, Any]) -> None:
        self.client = client
        self.pod = pod
        self.timings = Timings(requested=time.monotonic())
        self._traced: Timings | None = None  # the Timings whose start was traced
        self._token: str | None = None
        self.released = False

    # -- identity ------------------------------------------------------------
    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.pod["metadata"]["namespace"])

    @property
    def id(self) -> str:
        return str(self.pod["metadata"]["labels"][LABEL_ID])

    @property
    def ip(self) -> str | None:
        return (self.pod.get("status") or {}).get("podIP")

    def __repr__(self) -> str:
        return f"<Sandbox {self.namespace}/{self.name}>"

    # -- lifecycle -------------------------------------------------------------
    @classmethod
    @sdk_errors("Sandbox.create")
    async def create(
        cls,
        client: SandmanClient,
        image: str,
        *,
        namespace: str | None = None,
        name: str | None = None,
        command: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        resources: Mapping[str, Any] | None = None,
        ttl: str | None = None,
        idle_timeout: str | None = None,
        profile: str | None = None,
        workspace: str | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        node_selector: Mapping[str, str] | None = None,
        tolerations: Sequence[Mapping[str, Any]] | None = None,
        timeout_s: float = 300.0,
        unschedulable_grace: dt.timedelta = UNSCHEDULABLE_GRACE,
        wait: bool = True,
        create_fn: Callable[[dict[str, Any], str], Awaitable[dict[str, Any]]] | None = None,
        ask_daemon: bool = True,
    ) -> Sandbox:
        """Create a labeled pod and (by default) wait until its daemon is Ready.

        Raises SandboxStartError(reason, retryable) as soon as the cause is
        known (the pod is deleted then, so nothing is left behind).
        ``create_fn(body, namespace)`` replaces the plain API create, e.g. with
        a pool manager's rate-limited one. ``ask_daemon``: see ``wait_ready``.
        """
        client.check_open()
        ns = namespace or client.namespace
        body = build_pod(
            image,
            name=name,
            command=command,
            env=env or {},
            resources=resources,
            ttl=ttl,
            idle_timeout=idle_timeout,
            profile=profile,
            workspace=workspace,
            labels=labels or {},
            annotations=annotations or {},
            node_selector=node_selector,
            tolerations=tolerations,
        )
        requested = time.monotonic()
        try:
            if create_fn is None:
                created = await client.kube.create(PODS, body, ns)
            else:
                created = await create_fn(body, ns)
        except ApiError as e:
            err = startup.admission_error(e.status, e.body)
            refused = cls(client, {**body, "metadata": {**body["metadata"], "namespace": ns}})
            refused.timings.requested, refused.timings.created = requested, time.monotonic()
            refused._trace_start(err)
            raise err from None
        sb = cls(client, created)
        sb.timings.requested, sb.timings.created = requested, time.monotonic()
        if wait:
            try:
                await sb.wait_ready(
                    timeout_s, unschedulable_grace=unschedulable_grace, ask_daemon=ask_daemon
                )
            except BaseException as e:
                sb._trace_start(e)
                await sb.release()
                raise
        return sb

    @classmethod
    @sdk_errors("Sandbox.attach")
    async def attach(
        cls, client: SandmanClient, name: str, namespace: str | None = None
    ) -> Sandbox:
        """A handle on a sandbox created by other tooling (kubectl, a Job, a pool)."""
        client.check_open()
        try:
            pod = await client.kube.get(PODS, name, namespace or client.namespace)
        except ApiError as e:
            if e.not_found:
                raise SandboxGone(f"no pod {namespace or client.namespace}/{name}") from None
            raise
        if LABEL_ID not in ((pod.get("metadata") or {}).get("labels") or {}):
            raise SandboxStartError(
                SandboxStartError.INVALID,
                f"pod {name} is not a sandbox (no {LABEL_ID} label)",
                retryable=False,
                pod=name,
            )
        return cls(client, pod)

    @sdk_errors("Sandbox.wait_ready")
    async def wait_ready(
        self,
        timeout_s: float = 300.0,
        *,
        unschedulable_grace: dt.timedelta = UNSCHEDULABLE_GRACE,
        ask_daemon: bool = True,
    ) -> None:
        """Wait until the daemon takes commands; fail fast with a classified error.

        Two signals race. The pod's Ready condition, from the client's shared
        pod watch (no polling), which also classifies start failures. And,
        where the client reaches pod IPs, the daemon itself: once the pod has
        an IP and its init containers have ended, ``GET /readyz`` is asked
        directly every ``DAEMON_POLL_S``. The daemon answers 200 only after
        its start-up (the pristine record) and the container's own readiness
        probe, the same meaning as Ready, without the kubelet's probe period,
        its next relist and the status round trip (docs/performance.md).
        ``ask_daemon=False``: the Ready condition only.
        """
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(timeout_s):
                watching = asyncio.ensure_future(self._watch_until_ready(t0, unschedulable_grace))
                asking = asyncio.ensure_future(
                    self._daemon_answers() if ask_daemon else asyncio.Event().wait()
                )
                try:
                    done, _ = await asyncio.wait(
                        {watching, asking}, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    for task in (watching, asking):
                        task.cancel()
                    await asyncio.gather(watching, asking, return_exceptions=True)
                if watching in done:
                    watching.result()  # its start error, if that is how it ended
        except TimeoutError:
            raise SandboxStartError(
                SandboxStartError.TIMEOUT,
                f"not Ready after {timeout_s:.0f}s",
                retryable=True,
                pod=self.name,
            ) from None

    @sdk_errors("Sandbox.wait_pod")
    async def wait_pod(
        self, until: Callable[[dict[str, Any]], bool], timeout_s: float = 30.0
    ) -> dict[str, Any]:
        """The pod once ``until(pod)`` holds, from the shared pod watch.

        The daemon can answer before the kubelet reports the container
        running, so a caller that needs status fields (``imageID``,
        ``startedAt``) waits here for them. WaitTimeout (a TimeoutError)
        after ``timeout_s``.
        """
        try:
            async with asyncio.timeout(timeout_s):
                await self._watch_until(until)
        except TimeoutError:
            raise WaitTimeout(
                f"{self}: the pod's status did not come within {timeout_s:.0f}s"
            ) from None
        except SandboxStartError as e:
            if e.reason != SandboxStartError.DELETED:
                raise
            # Not a start any more: say what was being waited for.
            raise SandboxStartError(
                e.reason,
                "the pod was deleted while waiting for its status",
                retryable=e.retryable,
                pod=self.name,
            ) from None
        return self.pod

    async def _watch_until_ready(self, t0: float, grace: dt.timedelta) -> None:
        await self._watch_until(lambda pod: self._observe(pod, t0, grace))

    async def _watch_until(self, done: Callable[[dict[str, Any]], bool]) -> None:
        async with self.client.pod_watch.follow(self.namespace, self.name) as events:
            # MUST read after following: a change between the two would be lost.
            await self._reread()
            if done(self.pod):
                return
            while True:
                kind, obj = await events.get()
                if kind == podwatch.ERROR:
                    raise obj
                if kind == podwatch.RESYNC:
                    await self._reread()
                elif not self._newer(obj):
                    continue  # another pod of the name, or older than what we hold
                elif kind == "DELETED":
                    self._gone()
                else:
                    self.pod = obj
                if done(self.pod):
                    return

    async def _reread(self) -> None:
        try:
            pod = await self.client.kube.get(PODS, self.name, self.namespace)
        except ApiError as e:
            if e.not_found:
                self._gone()
            raise
        if pod["metadata"].get("uid") != self.pod["metadata"].get("uid"):
            self._gone()  # the name now belongs to another pod
        self.pod = pod

    def _gone(self) -> NoReturn:
        raise SandboxStartError(
            SandboxStartError.DELETED,
            "the pod was deleted before it was Ready",
            retryable=True,
            pod=self.name,
        )

    def _newer(self, obj: dict[str, Any]) -> bool:
        """An event about this pod that is not older than the copy we hold."""
        md, held = obj.get("metadata") or {}, self.pod["metadata"]
        if md.get("uid") != held.get("uid"):
            return False
        a, b = md.get("resourceVersion", ""), held.get("resourceVersion", "")
        return not (a.isdigit() and b.isdigit() and int(a) < int(b))

    async def _daemon_answers(self) -> None:
        """Return once the daemon answers ``GET /readyz`` at the pod's IP; wait
        forever when the transport cannot reach pod IPs (the watch decides)."""
        ask = getattr(self.client.transport, "daemon_ready", None)
        if ask is None:
            await asyncio.Event().wait()
        while True:
            if self.ip and startup.daemon_may_answer(self.pod):
                answer = await ask(self.ip)
                if answer is None:
                    await asyncio.Event().wait()
                if answer:
                    t = self.timings
                    t.ready = time.monotonic()
                    # The daemon answered before the watch showed the
                    # container running: it started by now at the latest
                    # (traces keep their start phase; it ends at ready).
                    if t.started is None:
                        t.started = t.ready
                    return
            await asyncio.sleep(DAEMON_POLL_S)

    def _observe(self, pod: dict[str, Any], t0: float, grace: dt.timedelta) -> bool:
        now = time.monotonic()
        t = self.timings
        if t.scheduled is None and (pod.get("spec") or {}).get("nodeName"):
            t.scheduled = now
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        if t.started is None and any("running" in (s.get("state") or {}) for s in statuses):
            t.started = now
        if startup.ready(pod):
            t.ready = now
            return True
        err = startup.verdict(pod, waited=dt.timedelta(seconds=now - t0), unschedulable_grace=grace)
        if err is not None:
            raise err
        return False

    @sdk_errors("Sandbox.release")
    async def release(self) -> None:
        """Delete the pod (idempotent; a pod already gone is fine)."""
        if self.released:
            return
        self._trace_start()  # a start no command ended
        try:
            await self.client.kube.delete(
                PODS, self.name, self.namespace, uid=self.pod["metadata"].get("uid")
            )
        except ApiError as e:
            if not (e.not_found or e.conflict):  # conflict: UID differs, a new pod: not ours
                raise
        self.released = True

    def _trace_start(self, error: BaseException | None = None) -> None:
        """Hand this start to tracing once per Timings (a fleet restarts them
        after a reset); a no-op unless tracing is configured."""
        tracing = self.client.telemetry.tracing
        if tracing.enabled and self._traced is not self.timings:
            self._traced = self.timings
            tracing.sandbox(self.client.kube, self.pod, self.timings, error)

    @sdk_errors("Sandbox.extend")
    async def extend(self, ttl: str | dt.timedelta) -> dt.datetime:
        """Move the lease's end to now + ttl (within the policy's maximum)."""
        td = parse_duration(ttl) if isinstance(ttl, str) else ttl
        until = dt.datetime.now(dt.UTC) + td
        patch = [
            {
                "op": "add",
                "path": "/metadata/annotations/" + ANN_EXPIRES_AT.replace("/", "~1"),
                "value": format_time(until),
            }
        ]
        try:
            self.pod = await self.client.kube.patch(
                PODS, self.name, patch, self.namespace, content_type=JSON_PATCH
            )
        except ApiError as e:
            if e.not_found:
                raise SandboxGone(f"{self} is gone") from None
            raise DaemonError(e.status, "extend_denied", e.body.get("message", str(e))) from None
        return until

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()

    # -- daemon calls ----------------------------------------------------------
    async def _target(self) -> Target:
        if self._token is None:
            self._token = await self.client.token_for(
                self.namespace, self.id, key_id=annotations(self.pod).get(ANN_KEY_ID)
            )
        return Target(self.namespace, self.name, self.ip, self._token)

    @sdk_errors("Sandbox")
    async def _send(
        self,
        method: str,
        path: str,
        *,
        body: Any = UNSET,
        data: Any = None,
        params: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> DaemonResponse:
        """The daemon's answer, its body unread; a 4xx/5xx is raised as the SDK's error."""
        resp = await self.client.transport.send(
            await self._target(),
            DaemonRequest(method, path, dict(params or {}), None if body is UNSET else body, data),
            timeout,
        )
        if resp.status >= 400:
            raise _daemon_error(resp.status, await read_prefix(resp, MAX_ERROR_BYTES), self)
        return resp

    @sdk_errors("Sandbox")
    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = UNSET,
        data: Any = None,
        params: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        max_bytes: int = MAX_JSON_BYTES,
    ) -> Any:
        """A call of the daemon's JSON API: its decoded answer (an answer that is
        not a JSON document, e.g. an empty 204, is returned as bytes)."""
        resp = await self._send(method, path, body=body, data=data, params=params, timeout=timeout)
        payload = await read_bounded(
            resp,
            max_bytes,
            what=f"{self}: {method} {path}",
            remedy="the daemon's API answers far less; this sandbox's daemon is not "
            "Sandman's (the agent may have replaced it): replace the sandbox",
        )
        ctype_json = payload[:1] in (b"{", b"[")
        return (
            loads(payload, status=resp.status, what=f"{self}: {method} {path}")
            if ctype_json
            else payload
        )

    @sdk_errors("Sandbox.exec")
    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        body = _exec_body(cmd, cwd, env, stdin, timeout_s, max_output_bytes)
        doc = await self._call(
            "POST",
            "/v1/exec",
            body=body,
            timeout=timeout_s + 30,
            max_bytes=exec_answer_bound(max_output_bytes),
        )
        if self.timings.first_result is None:
            self.timings.first_result = time.monotonic()
            self._trace_start()
        return ExecResult.from_json(doc)

    @sdk_errors("Sandbox.exec_stream")
    async def exec_stream(
        self,
        cmd: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: str | bytes | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> AsyncIterator[tuple[str, bytes] | ExecResult]:
        """Yields (stream, bytes) chunks as they come, then the final ExecResult.
        ``stdin`` is the command's whole input (sent with the request)."""
        body = _exec_body(cmd, cwd, env, stdin, timeout_s, None)
        resp = await self._send(
            "POST", "/v1/exec", body=body, params={"stream": "1"}, timeout=timeout_s + 30
        )
        what = f"{self}: POST /v1/exec?stream=1"
        chunks = resp.chunks()
        buf = bytearray()
        try:
            async for chunk in chunks:
                buf += chunk
                while (end := buf.find(b"\n")) >= 0:
                    line = bytes(buf[:end])
                    del buf[: end + 1]
                    yield _stream_record(loads(line, status=resp.status, what=what), resp.status)
                if len(buf) > MAX_JSON_BYTES:  # one record, no end in sight
                    raise ResponseTooLarge(
                        resp.status,
                        MAX_JSON_BYTES,
                        f"{what}: one record",
                        "the daemon's records are far shorter; its daemon is not "
                        "Sandman's (the agent may have replaced it): replace the sandbox",
                    )
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]

    @sdk_errors("Sandbox.session")
    async def session(
        self, *, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> Session:
        body: dict[str, Any] = {}
        if cwd:
            body["cwd"] = cwd
        if env:
            body["env"] = dict(env)
        doc = await self._call("POST", "/v1/sessions", body=body)
        return Session(self, doc["id"])

    @sdk_errors("Sandbox.pty")
    async def pty(
        self,
        cmd: str | Sequence[str] | None = None,
        *,
        rows: int = 24,
        cols: int = 80,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        term: str = "xterm-256color",
        timeout_s: float = pty_mod.START_TIMEOUT_S,
    ) -> pty_mod.Terminal:
        """An interactive program (default: the image's shell) on a terminal of
        ``rows`` x ``cols``: vim, a REPL. See sandman.client.pty.Terminal."""
        sock = await self.client.transport.websocket(await self._target(), "/v1/pty", timeout_s)
        start = pty_mod.start_message(cmd, rows=rows, cols=cols, cwd=cwd, env=env, term=term)
        try:
            async with asyncio.timeout(timeout_s):
                return await pty_mod.Terminal.open(sock, start)
        except TimeoutError:
            raise TransportError(
                f"{self}: the terminal did not start in {timeout_s:.0f}s"
            ) from None

    @sdk_errors("Sandbox.start")
    async def start(
        self,
        cmd: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bool = False,
        name: str | None = None,
    ) -> Process:
        body: dict[str, Any] = {"cmd": cmd if isinstance(cmd, str) else list(cmd), "stdin": stdin}
        if cwd:
            body["cwd"] = cwd
        if env:
            body["env"] = dict(env)
        if name:
            body["name"] = name
        doc = await self._call("POST", "/v1/processes", body=body)
        return Process(self, doc["id"], doc["pid"])

    @sdk_errors("Sandbox.processes")
    async def processes(self) -> list[Process]:
        """The background processes the daemon keeps records of, running or
        finished (``Process.info()`` for details; names and commands are in
        ``Process.record``)."""
        doc = await self._call("GET", "/v1/processes")
        return [Process(self, p["id"], p["pid"], record=p) for p in doc["processes"]]

    @sdk_errors("Sandbox.read_file")
    async def read_file(self, path: str, *, max_bytes: int = MAX_FILE_BYTES) -> bytes:
        """The file's bytes, exactly as stored. ResponseTooLarge once it passes
        ``max_bytes`` (default 256 MiB): reading stops there. For larger files
        pass a larger bound, or stream with ``read_file_chunks``."""
        resp = await self._send("GET", "/v1/files", params={"path": path})
        return await read_bounded(
            resp,
            max_bytes,
            what=f"{self}: {path}",
            remedy="pass read_file(path, max_bytes=N) to read more, or stream it with "
            "read_file_chunks(path)",
        )

    @sdk_errors("Sandbox.read_file_chunks")
    async def read_file_chunks(self, path: str) -> AsyncIterator[bytes]:
        """The file's bytes as they arrive, never held whole. The first step
        raises the daemon's error (a missing file) before any byte; a file cut
        short on the way raises TransportError, never a short end that looks
        whole."""
        resp = await self._send("GET", "/v1/files", params={"path": path})
        chunks = resp.chunks()
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]

    @sdk_errors("Sandbox.write_file")
    async def write_file(
        self, path: str, data: bytes | str, *, mode: str = "0644", mkdirs: bool = True
    ) -> None:
        raw = data.encode() if isinstance(data, str) else data
        await self._call(
            "PUT",
            "/v1/files",
            data=raw,
            params={"path": path, "mode": mode, "mkdirs": "1" if mkdirs else "0"},
        )

    async def stat(self, path: str) -> dict[str, Any]:
        return await self._call("GET", "/v1/files/stat", params={"path": path})  # type: ignore[no-any-return]

    async def list_dir(self, path: str) -> list[dict[str, Any]]:
        return (await self._call("GET", "/v1/files/list", params={"path": path}))["entries"]  # type: ignore[no-any-return]

    async def mkdir(self, path: str) -> None:
        await self._call("POST", "/v1/files/mkdir", body={"path": path, "parents": True})

    async def move(self, src: str, dst: str, *, overwrite: bool = False) -> None:
        await self._call(
            "POST", "/v1/files/move", body={"src": src, "dst": dst, "overwrite": overwrite}
        )

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        await self._call("POST", "/v1/files/remove", body={"path": path, "recursive": recursive})

    async def upload_tar(self, directory: str, tar_bytes: bytes) -> dict[str, Any]:
        return await self._call(
            "PUT",
            "/v1/files/tar",
            data=tar_bytes,  # type: ignore[no-any-return]
            params={"path": directory, "mkdirs": "1"},
        )

    @sdk_errors("Sandbox.download_tar")
    async def download_tar(
        self, path: str, *, gzip: bool = False, max_bytes: int = MAX_FILE_BYTES
    ) -> bytes:
        """The whole archive, or an error: never a truncated tar that looks whole.

        Raises StreamAborted when the daemon cut the stream (a file vanished or
        changed while it was archived: retry when the tree is quiet),
        TransportError when the connection broke off for another reason, and
        ResponseTooLarge once the archive passes ``max_bytes`` (default 256
        MiB; reading stops there: pass a larger bound, or ``gzip=True``).
        """
        resp = await self._send(
            "GET", "/v1/files/tar", params={"path": path, "gzip": "1" if gzip else "0"}
        )
        data = bytearray()
        chunks = resp.chunks()
        try:
            async for chunk in chunks:
                if len(data) + len(chunk) > max_bytes:
                    raise ResponseTooLarge(
                        resp.status,
                        max_bytes,
                        f"{self}: the archive of {path}",
                        "pass download_tar(path, max_bytes=N) to read more, or gzip=True",
                    )
                data += chunk
        except TransportError as e:
            raise _stream_error(resp.status, bytes(data[-8192:])) or e from e
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]
        # A cut stream always ends in a transport error; this is belt and braces.
        err = _stream_error(resp.status, bytes(data[-8192:]))
        if err is not None:
            raise err
        return bytes(data)

    @sdk_errors("Sandbox.reset")
    async def reset(self) -> dict[str, Any]:
        """Restore for reuse. Before reusing, ask ``reuse_refusal(report)``: a
        sandbox with drift, or whose container restarted, must be replaced."""
        return await self._call("POST", "/v1/reset", timeout=300)  # type: ignore[no-any-return]

    @sdk_errors("Sandbox.reuse_refusal")
    async def reuse_refusal(self, report: dict[str, Any]) -> str | None:
        """Why this sandbox must be replaced after ``reset()`` answered
        ``report``, or None when it may serve another rollout.

        MUST be called after the reset answered: it reads the pod afresh, so a
        container restart during the rollout or the reset is seen (a
        restarted daemon's ``clean: true`` proves nothing: ``reuse.py``). A
        pod that is gone is refused; other API errors are raised.
        """
        try:
            pod = await self.client.kube.get(PODS, self.name, self.namespace)
        except ApiError as e:
            if e.not_found:
                return "the pod is gone"
            raise
        if pod["metadata"].get("uid") != self.pod["metadata"].get("uid"):
            return "the pod is gone (another pod has its name)"
        self.pod = pod
        return reuse.refusal(report, pod)

    @sdk_errors("Sandbox.status")
    async def status(self) -> dict[str, Any]:
        return await self._call("GET", "/v1/status")  # type: ignore[no-any-return]


def _exec_body(
    cmd: str | Sequence[str],
    cwd: str | None,
    env: Mapping[str, str] | None,
    stdin: str | bytes | None,
    timeout_s: float,
    max_output_bytes: int | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "cmd": cmd if isinstance(cmd, str) else list(cmd),
        "timeout_s": timeout_s,
    }
    if cwd:
        body["cwd"] = cwd
    if env:
        body["env"] = dict(env)
    if stdin is not None:
        if isinstance(stdin, bytes):
            body["stdin"], body["stdin_encoding"] = base64.b64encode(stdin).decode(), "base64"
        else:
            body["stdin"] = stdin
    if max_output_bytes is not None:
        body["max_output_bytes"] = max_output_bytes
    return body


def exec_answer_bound(max_output_bytes: int | None) -> int:
    """The largest answer a daemon gives to an exec with ``max_output_bytes``
    per stream: each stream's bytes, at most 6-fold once JSON escapes them
    (``\\u0001`` for one control byte), in two streams, plus room for the
    rest of the document. Never below the JSON API's bound.

    >>> exec_answer_bound(None) == MAX_JSON_BYTES  # the daemon's default is 1 MiB
    True
    >>> exec_answer_bound(64 << 20) // (1 << 20)  # 2 * 6 * 64 MiB + 1 MiB
    769
    """
    if max_output_bytes is None:
        return MAX_JSON_BYTES
    return max(MAX_JSON_BYTES, 2 * 6 * max_output_bytes + (1 << 20))


def _stream_record(rec: Any, status: int) -> tuple[str, bytes] | ExecResult:
    """One record of a streamed exec: an output chunk, or the result."""
    try:
        if rec["type"] == "output":
            return str(rec["stream"]), decode_output(rec["data"], rec["encoding"])
        return ExecResult.from_json({**rec, "stdout": "", "stderr": ""})
    except (KeyError, TypeError, ValueError) as e:
        raise ProtocolError(
            status, f"a streamed exec record lacks a field or a type ({e!r})"
        ) from None


def _stream_error(status: int, tail: bytes) -> StreamAborted | None:
    """The daemon's error record at the end of a stream it cut, if it got here
    (a proxy on the way may drop the last bytes of a broken stream)."""
    at = tail.rfind(STREAM_ERROR_MARKER)
    if at < 0 or not tail.endswith(b"\n"):
        return None
    try:
        doc = json.loads(tail[at + len(STREAM_ERROR_MARKER) :])
        return StreamAborted(status, str(doc["code"]), str(doc["message"]))
    except (ValueError, KeyError, TypeError, RecursionError):
        return None


def _daemon_error(status: int, payload: bytes, sb: Sandbox) -> Exception:
    try:
        err = json.loads(payload)["error"]
        code, message = str(err["code"]), str(err["message"])
    except (ValueError, KeyError, TypeError, RecursionError):
        code, message = "http_error", payload[:300].decode(errors="replace")
    if status == 401:
        return Unauthorized(status, code, message)
    if status in (502, 503, 504) and code == "http_error":
        return TransportError(f"{sb}: HTTP {status} from the path to the daemon: {message}")
    return DaemonError(status, code, message)
