"""Sandbox commands for kubectl-only users.

run, exec, shell, cp, ls, ps, logs, port-forward, extend, release, token.
Installed as `sandman` and as the kubectl plugin `kubectl-sandman`, so
`kubectl sandman exec POD -- CMD` works with nothing but a kubeconfig: the
token is derived from the namespace's `sandman-access` Secret, which the
user's own RBAC lets them read (manifests/rbac: the sandman-user role).
Every command takes kubectl's `--kubeconfig`, `--context` and
`-n/--namespace`; names may be given as `pod/NAME`, as `-o name` prints them.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import io
import json
import os
import signal
import sys
import tarfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp

from sandman.cli import common, durations
from sandman.cli.common import CliError, UsageError, add_kube_flags
from sandman.cli.output import (
    ONE_FORMATS,
    Column,
    Formats,
    add_output_flag,
    duration,
    emit,
    emit_one,
    output_format,
    strip_kind,
)
from sandman.client import DaemonError, Sandbox, SandmanClient, SandmanError
from sandman.client.results import Process
from sandman.contract import (
    ANN_CLAIMED_BY,
    ANN_CONTAINER,
    ANN_EXPIRES_AT,
    ANN_IDLE_TIMEOUT,
    ANN_KEY_ID,
    ANN_PROFILE,
    LABEL_POOL,
    LABEL_SANDBOX,
    annotations,
    parse_time,
)
from sandman.kube_async import PODS, ApiError, KubeconfigError, list_all, load_credentials

# kubectl's annotation naming a pod's default container (for `logs`).
DEFAULT_CONTAINER_ANN = "kubectl.kubernetes.io/default-container"
# `logs -f` long-polls the daemon this long per request (the daemon's cap is 60).
FOLLOW_POLL_S = 30.0
# `ls` asks each sandbox's daemon for its idle time; beyond this many sandboxes
# only those with an idle timeout are asked (the others' idleness changes nothing).
LS_IDLE_POLL_MAX = 50


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def cmd(name: str, fn: Any, **kw: Any) -> argparse.ArgumentParser:
        p = sub.add_parser(name, **kw)
        add_kube_flags(p, transport=True)
        p.set_defaults(sandbox_cmd=fn)
        return p

    p = cmd(
        "run",
        cmd_run,
        help="create a sandbox from an image and print its name",
        usage="%(prog)s [NAME] --image=IMAGE [options] [-- COMMAND ...]\n"
        "       %(prog)s IMAGE [options] [-- COMMAND ...]",
        description="As kubectl run: `run NAME --image=IMAGE -- COMMAND`. Without --image "
        "the one positional argument is the image and the sandbox gets a generated name "
        "(or --name).",
    )
    p.add_argument("target", nargs="?", metavar="NAME|IMAGE", help="NAME with --image, else IMAGE")
    p.add_argument("--image", help="the sandbox's image (then the positional is its NAME)")
    p.add_argument("--name", help="the pod's name (default: generated)")
    p.add_argument("--ttl", type=durations.lease, help="lease, e.g. 30m (default: the policy's)")
    p.add_argument("--idle-timeout", type=durations.lease, help="release after this long idle")
    p.add_argument("--profile")
    p.add_argument("--workspace")
    p.add_argument("--env", "-e", action="append", default=[], metavar="K=V")
    p.add_argument("--cpu")
    p.add_argument("--memory")
    p.add_argument("--node-selector", action="append", default=[], metavar="K=V")
    p.add_argument(
        "--timeout", type=durations.seconds, default=300.0, help="wait this long for Ready (300s)"
    )
    p.add_argument(
        "-o",
        "--output",
        type=output_format(ONE_FORMATS),
        choices=Formats(ONE_FORMATS),
        default=None,
        metavar="FORMAT",
        help="name: pod/NAME; json|yaml|jsonpath=TEMPLATE: name, namespace, id, ip, "
        "timings (default: NAME)",
    )
    # The command comes after `--` (split off before argparse sees it: argparse
    # mishandles `--` inside subcommands), so options may follow IMAGE.
    p.set_defaults(command=[])

    p = cmd(
        "exec",
        cmd_exec,
        help="run a command in a sandbox; its exit code is ours",
        usage="%(prog)s [-i] [-t] [-c CONTAINER] [options] POD -- COMMAND ...",
        description="Run COMMAND in the sandbox and exit with its exit code. As kubectl "
        "exec: -i sends stdin, -t gives it a terminal; `-it POD -- bash` is interactive, "
        "as `shell` is. Exit codes of Sandman's own: docs/cli.md.",
    )
    p.add_argument("pod")
    p.add_argument(
        "-c",
        "--container",
        help="the sandbox's container (the only one commands run in; default: it)",
    )
    p.add_argument(
        "-t",
        "--tty",
        action="store_true",
        help="run it on a terminal; with -i and a local terminal, interactively",
    )
    p.add_argument("--cwd")
    p.add_argument("--env", "-e", action="append", default=[], metavar="K=V")
    p.add_argument(
        "--timeout", type=durations.seconds, default=600.0, help="the command's limit (600s)"
    )
    p.add_argument(
        "-i",
        "--stdin",
        action="store_true",
        help="send our stdin (without -t: read to its end first)",
    )
    p.add_argument(
        "-d",
        "--detach",
        action="store_true",
        help="start it as a background process and print its id (see `logs`, `ps`)",
    )
    p.add_argument("--name", help="with -d: a name for `logs POD NAME`")
    p.set_defaults(command=[])

    p = cmd("shell", cmd_shell, help="an interactive shell session (cd/export persist)")
    p.add_argument("pod")

    p = cmd(
        "cp",
        cmd_cp,
        help="copy files: POD:PATH LOCAL, or LOCAL POD:PATH",
        description="Copy a file or tree out of a sandbox or into it, as cp does: into DST "
        "if it is a directory (or ends with /), else to DST as the new name.",
    )
    p.add_argument("src")
    p.add_argument("dst")

    p = cmd("ls", cmd_ls, help="sandboxes with age, lease left, idle time, node, state")
    p.add_argument("-A", "--all-namespaces", action="store_true")
    p.add_argument("-l", "--selector", help="label selector, as kubectl's (ANDed with sandboxes)")
    add_output_flag(p)

    p = cmd("ps", cmd_ps, help="a sandbox's background processes (running and finished)")
    p.add_argument("pod")
    add_output_flag(p)

    p = cmd(
        "logs",
        cmd_logs,
        help="a background process's output, or the sandbox container's log",
        description="`logs POD PROC` prints the output of a background process (PROC: its "
        "id or name, see `ps`); `logs POD` prints the container's log (the image's own "
        "command), as kubectl logs does.",
    )
    p.add_argument("pod")
    p.add_argument("proc", nargs="?")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until it ends")
    p.add_argument(
        "--tail",
        type=int,
        default=-1,
        metavar="N",
        help="only the last N lines (then, with -f, what follows); -1: all (default)",
    )
    p.add_argument("--stream", choices=["combined", "stdout", "stderr"], default="combined")
    p.add_argument("-c", "--container", help="without PROC: this container's log")

    p = cmd(
        "port-forward",
        cmd_port_forward,
        help="forward local ports to ports inside a sandbox",
        usage="%(prog)s [options] POD [LOCAL:]REMOTE ...",
        description="Through the pods/portforward API, as kubectl port-forward: the port is "
        "dialled inside the sandbox's network namespace, so servers bound to 127.0.0.1 "
        "there work. LOCAL 0 or empty (`:8080`) picks a free port.",
    )
    p.add_argument("pod")
    p.add_argument("ports", nargs="+", metavar="[LOCAL:]REMOTE")
    p.add_argument("--address", default="127.0.0.1", help="local address to listen on")

    p = cmd("extend", cmd_extend, help="move a sandbox's lease end to now + DURATION")
    p.add_argument("pod")
    p.add_argument("duration", type=durations.lease, help="e.g. 30m, 1h30m, 600")

    p = cmd("release", cmd_release, help="delete sandboxes")
    p.add_argument("pod", nargs="+")

    p = cmd("token", cmd_token, help="print a sandbox's daemon token")
    p.add_argument("pod")


def default_namespace(kubeconfig: str | None, context: str | None = None) -> str:
    """The context's namespace, as kubectl uses it ("default" without a config)."""
    try:
        return load_credentials(kubeconfig, context).namespace
    except KubeconfigError:
        return "default"


def run_sandbox_command(args: argparse.Namespace) -> int:
    check_args(args)  # usage errors before any connection is made
    return common.run(args, args.sandbox_cmd)


def check_args(args: argparse.Namespace) -> None:
    """What argparse cannot check: UsageError (exit code 2), nothing sent anywhere."""
    if args.sandbox_cmd is cmd_run:
        args.image, args.name = run_target(args.target, args.image, args.name)
    elif args.sandbox_cmd is cmd_exec:
        if not args.command:
            raise UsageError("give a command after --, e.g. `sandman exec POD -- ls -l`")
        if args.detach and (args.stdin or args.tty):
            raise UsageError("-d does not go with -i or -t (a detached process has no stdin here)")


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _pairs(items: list[str], what: str) -> dict[str, str]:
    if bad := [s for s in items if "=" not in s]:
        raise CliError(f"{what} {bad[0]!r}: expected KEY=VALUE")
    return dict(s.split("=", 1) for s in items)


def pod_arg(name: str) -> str:
    return strip_kind(name, "pod", "pods")


async def attach(client: SandmanClient, name: str) -> Sandbox:
    return await Sandbox.attach(client, pod_arg(name))


def run_target(target: str | None, image: str | None, name: str | None) -> tuple[str, str | None]:
    """(image, name) from `run`'s arguments: kubectl's `run NAME --image=IMAGE`,
    and `run IMAGE` (Sandman's first form). --image decides: with it the
    positional is the name, without it the image; nothing is guessed from
    what the word looks like.

    >>> run_target("web", "python:3.11", None)
    ('python:3.11', 'web')
    >>> run_target("python:3.11", None, None)
    ('python:3.11', None)
    >>> run_target("python:3.11", None, "web")
    ('python:3.11', 'web')
    >>> run_target(None, "python:3.11", "web")
    ('python:3.11', 'web')
    """
    if image is not None:
        if target is not None and name is not None and pod_arg(target) != name:
            raise UsageError(f"run: the name is given twice ({target!r} and --name {name!r})")
        return image, pod_arg(target) if target is not None else name
    if target is None:
        raise UsageError("run: give the image: `run NAME --image=IMAGE` or `run IMAGE`")
    return target, name


def exec_mode(tty: bool, stdin: bool, stdin_isatty: bool) -> tuple[bool, str | None]:
    """(interactive on a terminal, a warning to print) for exec's -i/-t, as kubectl.

    >>> exec_mode(True, True, True)      # exec -it POD -- bash, at a terminal
    (True, None)
    >>> exec_mode(True, True, False)     # exec -it in a pipe: kubectl's warning, no terminal
    (False, 'Unable to use a TTY - input is not a terminal or the right kind of file')
    >>> exec_mode(False, True, True)     # exec -i: stdin is read to its end, then sent
    (False, None)
    >>> exec_mode(True, False, True)     # exec -t without -i: nothing to type into
    (False, None)
    """
    if tty and stdin:
        if stdin_isatty:
            return True, None
        return False, "Unable to use a TTY - input is not a terminal or the right kind of file"
    return False, None


def exec_container(pod: dict[str, Any], wanted: str | None) -> None:
    """`exec -c`: the sandbox's container is the one commands run in (its daemon
    is there); any other container is refused by name, not silently ignored."""
    if wanted is None:
        return
    ours = target_container(pod)
    if wanted == ours:
        return
    name = pod["metadata"]["name"]
    containers = [c["name"] for c in (pod.get("spec") or {}).get("containers") or []]
    if wanted not in containers:
        raise CliError(
            f"pod {name} has no container {wanted!r} (containers: {', '.join(containers)})"
        )
    raise CliError(
        f"container {wanted!r} of pod {name} is not the sandbox's: Sandman runs commands in "
        f"{ours!r} only (its daemon is there); for {wanted!r} use kubectl exec -c {wanted}, "
        "if your role allows it"
    )


def last_lines(data: bytes, n: int) -> bytes:
    r"""The last ``n`` lines of ``data`` (all for n < 0), as `logs --tail` shows them.

    >>> last_lines(b"a\nb\nc\n", 2)
    b'b\nc\n'
    >>> last_lines(b"a\nb\nc", 2)      # an unfinished last line counts as one
    b'b\nc'
    >>> last_lines(b"a\nb\n", 0), last_lines(b"a\nb\n", -1)
    (b'', b'a\nb\n')
    """
    if n < 0:
        return data
    if n == 0:
        return b""
    lines = data.splitlines(keepends=True)
    return b"".join(lines[-n:])


async def cmd_run(args: argparse.Namespace, client: SandmanClient) -> int:
    env = _pairs(args.env, "--env")
    resources = {}
    if args.cpu or args.memory:
        req = {k: v for k, v in (("cpu", args.cpu), ("memory", args.memory)) if v}
        resources = {"requests": req, "limits": req}
    _progress(f"creating a sandbox of {args.image} in namespace {client.namespace} ...")
    t0 = time.monotonic()
    sb = await Sandbox.create(
        client,
        args.image,
        name=args.name,
        command=args.command or None,
        env=env,
        resources=resources or None,
        ttl=args.ttl,
        idle_timeout=args.idle_timeout,
        profile=args.profile,
        workspace=args.workspace,
        node_selector=_pairs(args.node_selector, "--node-selector") or None,
        timeout_s=args.timeout,
    )
    phases = {k: round(v, 3) for k, v in sb.timings.phases().items() if v is not None}
    _progress(
        f"ready in {time.monotonic() - t0:.1f}s on {sb.pod['spec'].get('nodeName')} "
        f"({', '.join(f'{k}={v}' for k, v in phases.items())})"
    )
    doc = {"name": sb.name, "namespace": sb.namespace, "id": sb.id, "ip": sb.ip, "timings": phases}
    if not emit_one(doc, args.output, kind="pod"):
        print(f"pod/{sb.name}" if args.output == "name" else sb.name)
    return 0


async def cmd_exec(args: argparse.Namespace, client: SandmanClient) -> int:
    command = args.command
    env = _pairs(args.env, "--env") or None
    interactive, warning = exec_mode(args.tty, args.stdin, sys.stdin.isatty())
    sb = await attach(client, args.pod)
    exec_container(sb.pod, args.container)
    if warning:
        _progress(warning)
    if interactive:
        # A terminal: the command on a pseudo-terminal, as `shell` runs the image's shell.
        from sandman.cli import terminal

        return await terminal.interactive(sb, command, cwd=args.cwd, env=env)
    if args.detach:
        proc = await sb.start(command, cwd=args.cwd, env=env, name=args.name)
        print(proc.id)
        _progress(f"started pid {proc.pid}; its output: sandman logs {sb.name} {proc.id} -f")
        return 0
    stdin = sys.stdin.buffer.read() if args.stdin else None
    code = 0
    async for item in sb.exec_stream(
        command, cwd=args.cwd, env=env, stdin=stdin, timeout_s=args.timeout
    ):
        if isinstance(item, tuple):
            out = sys.stdout if item[0] == "stdout" else sys.stderr
            out.buffer.write(item[1])
            out.flush()
        else:
            if item.timed_out:
                print(f"error: timed out after {args.timeout:g}s", file=sys.stderr)
                return common.EXIT_TIMEOUT
            code = item.exit_code
    # Killed by signal N: report 128+N, as a shell does.
    return code if code >= 0 else 128 - code


async def cmd_shell(args: argparse.Namespace, client: SandmanClient) -> int:
    sb = await attach(client, args.pod)
    if sys.stdin.isatty() and sys.stdout.isatty():
        # A terminal: the image's shell on a pseudo-terminal (vim, REPLs, Ctrl-C).
        from sandman.cli import terminal

        return await terminal.interactive(sb)
    session = await sb.session()  # piped: one command per line, cd/export persist
    cwd = "/"
    interactive = sys.stdin.isatty()
    loop = asyncio.get_running_loop()
    try:
        while True:
            if interactive:
                print(f"{sb.name}:{cwd}$ ", end="", flush=True)
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            if not line.strip():
                continue
            r = await session.run(line.rstrip("\n"))
            sys.stdout.buffer.write(r.stdout_bytes)
            sys.stderr.buffer.write(r.stderr_bytes)
            sys.stdout.flush()
            cwd = r.cwd or cwd
            if r.exit_code != 0 and interactive:
                print(f"[exit {r.exit_code}]", file=sys.stderr)
    finally:
        await session.close()
    return 0


# -- cp ------------------------------------------------------------------------------
def split_spec(spec: str) -> tuple[str | None, str]:
    """``POD:PATH`` (also ``pod/POD:PATH``) or a local path (``./a:b`` is local)."""
    if ":" in spec and not spec.startswith(("/", ".", "~")):
        pod, path = spec.split(":", 1)
        return pod_arg(pod), path
    return None, spec


async def _is_remote_dir(sb: Sandbox, path: str) -> bool:
    try:
        st = await sb.stat(path)
    except DaemonError as e:
        if e.status == 404:
            return False
        raise
    return str(st.get("type")) == "dir"


async def cmd_cp(args: argparse.Namespace, client: SandmanClient) -> int:
    from sandman.cli import copying

    src_pod, src = split_spec(args.src)
    dst_pod, dst = split_spec(args.dst)
    if (src_pod is None) == (dst_pod is None):
        raise CliError("exactly one of SRC and DST must be POD:PATH")
    if src_pod is not None:
        sb = await Sandbox.attach(client, src_pod)
        data = await sb.download_tar(src)
        target = Path(dst).expanduser()
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            members = tar.getmembers()
            if not members:
                raise CliError(f"{src_pod}:{src}: nothing to copy")
            top = members[0].name.split("/")[0]
            try:
                if target.is_dir() or dst.endswith("/"):
                    copying.extract(tar, target, members)
                else:
                    copying.rename_top(members, top, target.name)
                    copying.extract(tar, target.parent, members)
            except copying.UnsafeArchive as e:
                msg = f"refused the archive from {src_pod}: {e} (nothing written)"
                raise CliError(msg) from None
        _progress(f"copied {len(members)} entries")
        return 0
    assert dst_pod is not None
    source = Path(src).expanduser()
    if not source.exists():
        raise CliError(f"{src}: no such file or directory")
    sb = await Sandbox.attach(client, dst_pod)
    if dst.endswith("/") or await _is_remote_dir(sb, dst):
        directory, name = dst, source.resolve().name
    else:  # `cp file POD:/dir/newname`: the copy gets the new name
        directory, name = os.path.dirname(dst.rstrip("/")) or "/", os.path.basename(dst)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(str(source), arcname=name)
    stats = await sb.upload_tar(directory, buf.getvalue())
    _progress(f"copied {stats['files']} files, {stats['bytes']} bytes")
    return 0


# -- listings ----------------------------------------------------------------------------
def target_container(pod: dict[str, Any]) -> str:
    """The sandbox's container: the annotation's, kubectl's default, else the first."""
    ann = annotations(pod)
    containers = [c["name"] for c in (pod.get("spec") or {}).get("containers") or []]
    for want in (ann.get(ANN_CONTAINER), ann.get(DEFAULT_CONTAINER_ANN)):
        if want in containers:
            return str(want)
    return containers[0] if containers else ""


def sandbox_row(pod: dict[str, Any], now: dt.datetime, idle_s: float | None) -> dict[str, Any]:
    md, st = pod["metadata"], pod.get("status") or {}
    ann = md.get("annotations") or {}
    created = parse_time(md["creationTimestamp"])
    exp = ann.get(ANN_EXPIRES_AT)
    left = (parse_time(exp) - now).total_seconds() if exp else None
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or []
    )
    containers = {c["name"]: c for c in (pod.get("spec") or {}).get("containers") or []}
    main = containers.get(target_container(pod)) or {}
    return {
        "namespace": md["namespace"],
        "name": md["name"],
        "age_s": round((now - created).total_seconds()),
        "lease_left_s": None if left is None else round(left),
        "idle_s": None if idle_s is None else round(idle_s),
        "node": (pod.get("spec") or {}).get("nodeName"),
        "state": "Terminating"
        if md.get("deletionTimestamp")
        else ("Ready" if ready else st.get("phase", "Pending")),
        "ip": st.get("podIP"),
        "image": main.get("image"),
        "profile": ann.get(ANN_PROFILE),
        "pool": (md.get("labels") or {}).get(LABEL_POOL),
        "claimed_by": ann.get(ANN_CLAIMED_BY),
    }


LS_COLUMNS = [
    Column("NAMESPACE", "namespace"),
    Column("NAME", "name"),
    Column("AGE", "age_s", show=duration),
    Column("LEASE LEFT", "lease_left_s", show=duration),
    Column("IDLE", "idle_s", show=duration),
    Column("NODE", "node"),
    Column("STATE", "state"),
    Column("IP", "ip", wide=True),
    Column("IMAGE", "image", wide=True),
    Column("PROFILE", "profile", wide=True),
    Column("POOL", "pool", wide=True),
    Column("CLAIMED BY", "claimed_by", wide=True),
]


async def cmd_ls(args: argparse.Namespace, client: SandmanClient) -> int:
    ns = None if args.all_namespaces else client.namespace
    selector = f"{LABEL_SANDBOX}=true" + (f",{args.selector}" if args.selector else "")
    pods, _ = await list_all(client.kube, PODS, ns, label_selector=selector)
    pods.sort(key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]))
    now = dt.datetime.now(dt.UTC)

    async def idle(pod: dict[str, Any]) -> float | None:
        if args.output == "name":
            return None  # names only: ask no daemon
        if ANN_IDLE_TIMEOUT not in annotations(pod) and len(pods) > LS_IDLE_POLL_MAX:
            return None
        try:
            sb = Sandbox(client, pod)
            return float((await asyncio.wait_for(sb.status(), 3))["idle_s"])
        except (SandmanError, ApiError, TimeoutError, KeyError, OSError):
            return None

    idles = await asyncio.gather(*(idle(p) for p in pods))
    rows = [sandbox_row(p, now, i) for p, i in zip(pods, idles, strict=True)]
    columns = LS_COLUMNS if args.all_namespaces else LS_COLUMNS[1:]
    emit(rows, columns, args.output, kind="pod")
    return 0


def process_row(rec: dict[str, Any], now: float) -> dict[str, Any]:
    running = bool(rec.get("running"))
    code = rec.get("exit_code")
    started, ended = rec.get("started_at"), rec.get("ended_at")
    cmd = rec.get("cmd")
    return {
        "id": rec["id"],
        "name": rec.get("name"),
        "pid": rec.get("pid"),
        "status": "Running" if running else f"Exited({code})",
        "exit_code": code,
        "age_s": None if started is None else round(now - float(started)),
        "ran_s": None if started is None else round((ended or now) - float(started)),
        "command": " ".join(cmd) if isinstance(cmd, list) else cmd,
        "stdin_open": rec.get("stdin_open"),
        "keeps_active": rec.get("keeps_active"),
        "output_bytes": (rec.get("output_bytes") or {}).get("combined"),
    }


PS_COLUMNS = [
    Column("ID", "id"),
    Column("NAME", "name"),
    Column("PID", "pid"),
    Column("STATUS", "status"),
    Column("AGE", "age_s", show=duration),
    Column("COMMAND", "command", show=lambda v: (v or "")[:60]),
    Column("RAN", "ran_s", wide=True, show=duration),
    Column("OUTPUT", "output_bytes", wide=True),
    Column("STDIN", "stdin_open", wide=True),
    Column("KEEPS ACTIVE", "keeps_active", wide=True),
]


async def cmd_ps(args: argparse.Namespace, client: SandmanClient) -> int:
    sb = await attach(client, args.pod)
    procs = await sb.processes()
    now = time.time()
    rows = sorted((process_row(p.record, now) for p in procs), key=lambda r: -(r["age_s"] or 0))
    emit(rows, PS_COLUMNS, args.output, kind="process", name_key="id")
    return 0


# -- logs ----------------------------------------------------------------------------------
def find_process(procs: list[Process], ref: str) -> Process:
    """By id, else by name (the newest of that name)."""
    ref = strip_kind(ref, "process")
    for p in procs:
        if p.id == ref:
            return p
    named = [p for p in procs if p.record.get("name") == ref]
    if named:
        return max(named, key=lambda p: float(p.record.get("started_at") or 0))
    known = ", ".join(f"{p.id} ({p.record.get('name')})" for p in procs) or "none"
    raise CliError(f"no background process {ref!r} (processes: {known}; see `sandman ps`)")


async def cmd_logs(args: argparse.Namespace, client: SandmanClient) -> int:
    sb = await attach(client, args.pod)
    if args.proc is None:
        return await _container_log(client, sb, args.container, args.follow, args.tail)
    proc = find_process(await sb.processes(), args.proc)
    offset = 0
    out = sys.stdout.buffer
    if args.tail >= 0:
        # What is kept so far, cut to its last N lines; then, with -f, what follows.
        kept = b""
        while True:
            page = await proc.read(offset=offset, stream=args.stream, wait_s=0.0)
            kept += page.data
            offset = page.next_offset
            if offset >= page.end:
                break
        out.write(last_lines(kept, args.tail))
        out.flush()
        if not args.follow or not page.running:
            return 0
    while True:
        page = await proc.read(
            offset=offset, stream=args.stream, wait_s=FOLLOW_POLL_S if args.follow else 0.0
        )
        if page.dropped and offset == 0:
            _progress(f"[{page.dropped} earlier bytes are no longer kept]")
        if page.data:
            out.write(page.data)
            out.flush()
        offset = page.next_offset
        if offset < page.end:
            continue  # more than one page is waiting
        if not args.follow or not page.running:
            break
    return 0


async def _container_log(
    client: SandmanClient, sb: Sandbox, container: str | None, follow: bool, tail: int = -1
) -> int:
    kube = client.kube
    params = {"container": container or target_container(sb.pod)}
    if follow:
        params["follow"] = "true"
    if tail >= 0:
        params["tailLines"] = str(tail)
    url = (
        f"{kube.creds.server}/api/v1/namespaces/{quote(sb.namespace)}/pods/{quote(sb.name)}/log"
        f"?{urlencode(params)}"
    )
    async with kube.session().get(
        url,
        headers=await kube.auth_headers(),
        timeout=aiohttp.ClientTimeout(total=None, sock_read=None if follow else 60),
        **kube.request_options(),
    ) as resp:
        if resp.status >= 400:
            body = await resp.read()
            try:
                doc = json.loads(body)
            except ValueError:
                doc = body.decode(errors="replace")
            raise ApiError(resp.status, doc)
        async for chunk in resp.content.iter_any():
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
    return 0


# -- port-forward ----------------------------------------------------------------------------
async def cmd_port_forward(args: argparse.Namespace, client: SandmanClient) -> int:
    from sandman.cli import portforward

    pairs = portforward.parse_ports(args.ports)
    sb = await attach(client, args.pod)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    def announce(line: str) -> None:
        print(line, flush=True)

    await portforward.forward(
        client.kube, sb.namespace, sb.name, pairs, address=args.address, announce=announce,
        until=stop,
    )  # fmt: skip
    return 0


# -- lease ----------------------------------------------------------------------------------
async def cmd_extend(args: argparse.Namespace, client: SandmanClient) -> int:
    sb = await attach(client, args.pod)
    until = await sb.extend(args.duration)
    print(until.strftime("%Y-%m-%dT%H:%M:%SZ"))
    return 0


async def cmd_release(args: argparse.Namespace, client: SandmanClient) -> int:
    for name in args.pod:
        sb = await attach(client, name)
        await sb.release()
        _progress(f"released {sb.name}")
    return 0


async def cmd_token(args: argparse.Namespace, client: SandmanClient) -> int:
    sb = await attach(client, args.pod)
    print(await client.token_for(sb.namespace, sb.id, key_id=annotations(sb.pod).get(ANN_KEY_ID)))
    return 0
