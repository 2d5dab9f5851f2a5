"""Sandbox commands for kubectl-only users: run, exec, shell, cp, ls, extend, release, token.

Installed as `sandman` and as the kubectl plugin `kubectl-sandman`, so
`kubectl sandman exec POD -- CMD` works with nothing but a kubeconfig: the
token is derived from the namespace's `sandman-access` Secret, which the
user's own RBAC lets them read.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import io
import json
import os
import sys
import tarfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sandman.client import Sandbox, SandboxStartError, SandmanClient, SandmanError
from sandman.contract import (
    ANN_EXPIRES_AT,
    ANN_IDLE_TIMEOUT,
    ANN_KEY_ID,
    LABEL_SANDBOX,
    annotations,
    parse_time,
)
from sandman.kube_async import PODS, list_all

Cmd = Callable[[argparse.Namespace, SandmanClient], Awaitable[int]]


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("-n", "--namespace", default=None, help="default: the kubeconfig's")
        p.add_argument("--kubeconfig", default=None)
        p.add_argument("--transport", choices=["auto", "direct", "proxy"], default="auto")
        p.add_argument("-o", "--output", choices=["text", "json"], default="text")

    p = sub.add_parser(
        "run",
        help="create a sandbox from IMAGE and print its name",
        usage="%(prog)s [options] IMAGE [-- COMMAND ...]",
    )
    common(p)
    p.add_argument("image")
    p.add_argument("--name")
    p.add_argument("--ttl")
    p.add_argument("--idle-timeout")
    p.add_argument("--profile")
    p.add_argument("--workspace")
    p.add_argument("--env", action="append", default=[], metavar="K=V")
    p.add_argument("--cpu")
    p.add_argument("--memory")
    p.add_argument("--timeout", type=float, default=300.0)
    # The command comes after `--` (split off before argparse sees it: argparse
    # mishandles `--` inside subcommands), so options may follow IMAGE.
    p.set_defaults(sandbox_cmd=cmd_run, command=[])

    p = sub.add_parser(
        "exec",
        help="run a command in a sandbox; its exit code is ours",
        usage="%(prog)s [options] POD -- COMMAND ...",
    )
    common(p)
    p.add_argument("pod")
    p.add_argument("--cwd")
    p.add_argument("--timeout", type=float, default=600.0)
    p.set_defaults(sandbox_cmd=cmd_exec, command=[])

    p = sub.add_parser("shell", help="an interactive shell session (cd/export persist)")
    common(p)
    p.add_argument("pod")
    p.set_defaults(sandbox_cmd=cmd_shell)

    p = sub.add_parser("cp", help="copy files: POD:PATH LOCAL, or LOCAL POD:PATH")
    common(p)
    p.add_argument("src")
    p.add_argument("dst")
    p.set_defaults(sandbox_cmd=cmd_cp)

    p = sub.add_parser("ls", help="sandboxes with age, lease left, idle time, node, state")
    common(p)
    p.add_argument("-A", "--all-namespaces", action="store_true")
    p.set_defaults(sandbox_cmd=cmd_ls)

    p = sub.add_parser("extend", help="move a sandbox's lease end to now + DURATION")
    common(p)
    p.add_argument("pod")
    p.add_argument("duration")
    p.set_defaults(sandbox_cmd=cmd_extend)

    p = sub.add_parser("release", help="delete a sandbox")
    common(p)
    p.add_argument("pod", nargs="+")
    p.set_defaults(sandbox_cmd=cmd_release)

    p = sub.add_parser("token", help="print a sandbox's daemon token")
    common(p)
    p.add_argument("pod")
    p.set_defaults(sandbox_cmd=cmd_token)


def default_namespace(kubeconfig: str | None) -> str:
    import yaml

    path = (
        kubeconfig
        or os.environ.get("KUBECONFIG", "").split(":")[0]
        or str(Path.home() / ".kube" / "config")
    )
    try:
        doc = yaml.safe_load(Path(path).read_text())
        ctx = next(c["context"] for c in doc["contexts"] if c["name"] == doc["current-context"])
        return str(ctx.get("namespace") or "default")
    except (OSError, KeyError, StopIteration, TypeError):
        return "default"


def run_sandbox_command(args: argparse.Namespace) -> int:
    ns = args.namespace or default_namespace(args.kubeconfig)

    async def main() -> int:
        async with SandmanClient(
            kubeconfig=args.kubeconfig, namespace=ns, transport=args.transport
        ) as client:
            return await args.sandbox_cmd(args, client)

    try:
        return asyncio.run(main())
    except SandboxStartError as e:
        print(
            f"error: sandbox did not start: {e.reason}: {e.message} "
            f"({'retryable' if e.retryable else 'not retryable'})",
            file=sys.stderr,
        )
        return 3
    except SandmanError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def cmd_run(args: argparse.Namespace, client: SandmanClient) -> int:
    env = dict(kv.split("=", 1) for kv in args.env)
    resources = {}
    if args.cpu or args.memory:
        req = {k: v for k, v in (("cpu", args.cpu), ("memory", args.memory)) if v}
        resources = {"requests": req, "limits": req}
    command = args.command
    _progress(f"creating a sandbox of {args.image} ...")
    t0 = time.monotonic()
    sb = await Sandbox.create(
        client,
        args.image,
        name=args.name,
        command=command or None,
        env=env,
        resources=resources or None,
        ttl=args.ttl,
        idle_timeout=args.idle_timeout,
        profile=args.profile,
        workspace=args.workspace,
        timeout_s=args.timeout,
    )
    phases = {k: round(v, 3) for k, v in sb.timings.phases().items() if v is not None}
    _progress(
        f"ready in {time.monotonic() - t0:.1f}s on {sb.pod['spec'].get('nodeName')} "
        f"({', '.join(f'{k}={v}' for k, v in phases.items())})"
    )
    if args.output == "json":
        print(
            json.dumps(
                {
                    "name": sb.name,
                    "namespace": sb.namespace,
                    "id": sb.id,
                    "ip": sb.ip,
                    "timings": phases,
                }
            )
        )
    else:
        print(sb.name)
    return 0


async def cmd_exec(args: argparse.Namespace, client: SandmanClient) -> int:
    command = args.command
    if not command:
        print("error: give a command after --", file=sys.stderr)
        return 2
    sb = await Sandbox.attach(client, args.pod)
    code = 0
    async for item in sb.exec_stream(command, cwd=args.cwd, timeout_s=args.timeout):
        if isinstance(item, tuple):
            out = sys.stdout if item[0] == "stdout" else sys.stderr
            out.buffer.write(item[1])
            out.flush()
        else:
            if item.timed_out:
                print(f"error: timed out after {args.timeout:.0f}s", file=sys.stderr)
                return 124
            code = item.exit_code
    # Killed by signal N: report 128+N, as a shell does.
    return code if code >= 0 else 128 - code


async def cmd_shell(args: argparse.Namespace, client: SandmanClient) -> int:
    sb = await Sandbox.attach(client, args.pod)
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


def _split(spec: str) -> tuple[str | None, str]:
    if ":" in spec and not spec.startswith(("/", ".")):
        pod, path = spec.split(":", 1)
        return pod, path
    return None, spec


async def cmd_cp(args: argparse.Namespace, client: SandmanClient) -> int:
    src_pod, src = _split(args.src)
    dst_pod, dst = _split(args.dst)
    if (src_pod is None) == (dst_pod is None):
        print("error: exactly one of SRC and DST must be POD:PATH", file=sys.stderr)
        return 2
    if src_pod is not None:
        sb = await Sandbox.attach(client, src_pod)
        data = await sb.download_tar(src)
        target = Path(dst)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            members = tar.getmembers()
            top = Path(src.rstrip("/")).name
            if target.is_dir():
                tar.extractall(target, filter="data")
            else:
                # `cp POD:/a/file ./newname`: rename the single top entry.
                for m in members:
                    m.name = str(Path(target.name) / Path(m.name).relative_to(top))
                tar.extractall(target.parent or Path("."), members=members, filter="data")
        print(f"copied {len(members)} entries", file=sys.stderr)
        return 0
    assert dst_pod is not None
    sb = await Sandbox.attach(client, dst_pod)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(src, arcname=Path(src).name)
    stats = await sb.upload_tar(dst, buf.getvalue())
    print(f"copied {stats['files']} files, {stats['bytes']} bytes", file=sys.stderr)
    return 0


async def cmd_ls(args: argparse.Namespace, client: SandmanClient) -> int:
    ns = None if args.all_namespaces else client.namespace
    pods, _ = await list_all(client.kube, PODS, ns, label_selector=f"{LABEL_SANDBOX}=true")
    now = dt.datetime.now(dt.UTC)

    async def idle(pod: dict[str, Any]) -> float | None:
        if ANN_IDLE_TIMEOUT not in (pod["metadata"].get("annotations") or {}) and len(pods) > 50:
            return None  # many sandboxes: poll only those where idleness matters
        try:
            sb = Sandbox(client, pod)
            return float((await asyncio.wait_for(sb.status(), 3))["idle_s"])
        except (SandmanError, TimeoutError, KeyError, OSError):
            return None

    idles = await asyncio.gather(*(idle(p) for p in pods))
    rows = []
    for pod, idle_s in zip(pods, idles, strict=True):
        md, st = pod["metadata"], pod.get("status") or {}
        created = parse_time(md["creationTimestamp"])
        exp = (md.get("annotations") or {}).get(ANN_EXPIRES_AT)
        left = (parse_time(exp) - now).total_seconds() if exp else None
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in st.get("conditions") or []
        )
        rows.append(
            {
                "namespace": md["namespace"],
                "name": md["name"],
                "age_s": round((now - created).total_seconds()),
                "lease_left_s": None if left is None else round(left),
                "idle_s": None if idle_s is None else round(idle_s),
                "node": (pod.get("spec") or {}).get("nodeName"),
                "state": "Ready" if ready else st.get("phase", "Pending"),
            }
        )
    if args.output == "json":
        print(json.dumps(rows, indent=2))
        return 0
    fmt = "{:<20} {:<36} {:>7} {:>10} {:>7} {:<16} {}"
    print(fmt.format("NAMESPACE", "NAME", "AGE", "LEASE LEFT", "IDLE", "NODE", "STATE"))
    for r in rows:
        print(
            fmt.format(
                r["namespace"],
                r["name"],
                _d(r["age_s"]),
                _d(r["lease_left_s"]),
                _d(r["idle_s"]),
                r["node"] or "-",
                r["state"],
            )
        )
    return 0


def _d(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    sign = "-" if s < 0 else ""
    s = abs(s)
    if s >= 3600:
        return f"{sign}{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{sign}{s // 60}m{s % 60:02d}s"
    return f"{sign}{s}s"


async def cmd_extend(args: argparse.Namespace, client: SandmanClient) -> int:
    sb = await Sandbox.attach(client, args.pod)
    until = await sb.extend(args.duration)
    print(until.strftime("%Y-%m-%dT%H:%M:%SZ"))
    return 0


async def cmd_release(args: argparse.Namespace, client: SandmanClient) -> int:
    for name in args.pod:
        sb = await Sandbox.attach(client, name)
        await sb.release()
        print(f"released {name}", file=sys.stderr)
    return 0


async def cmd_token(args: argparse.Namespace, client: SandmanClient) -> int:
    sb = await Sandbox.attach(client, args.pod)
    print(await client.token_for(sb.namespace, sb.id, key_id=annotations(sb.pod).get(ANN_KEY_ID)))
    return 0
