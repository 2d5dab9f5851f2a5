"""Warm-pool commands: `pool create|ls|scale|delete` and `claim`.

A pool is a plain ReplicaSet of idle sandbox pods, so these need only a kubeconfig:
a fixed-size pool needs no pool manager, its ReplicaSet refills after each claim.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import shlex
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sandman.cli import common, durations
from sandman.cli.common import CliError, add_kube_flags
from sandman.cli.output import (
    ONE_FORMATS,
    Column,
    Formats,
    add_output_flag,
    emit,
    emit_one,
    output_format,
    strip_kind,
)
from sandman.client import Sandbox, SandboxStartError, SandmanClient
from sandman.contract import (
    ANN_EXPIRES_AT,
    ANN_PROFILE,
    ANN_TTL,
    LABEL_ID,
    LABEL_POOL,
    parse_duration,
)
from sandman.kube_async import PODS, REPLICASETS, ApiError, KubeClient, list_all
from sandman.pools.claim import NoIdlePod, claim
from sandman.pools.health import FAILING, PoolHealth, pool_health
from sandman.pools.spec import PoolSpec, pool_selector, replicaset_name
from sandman.pools.warm import PoolRefused, dry_run_pod

Cmd = Callable[[argparse.Namespace, SandmanClient], Awaitable[int]]
DEFAULT_CLAIM_TTL = "30m"
POLL_S = 0.5


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def flags(p: argparse.ArgumentParser, cmd: Cmd) -> None:
        add_kube_flags(p)
        p.set_defaults(func=lambda args: common_run(args, cmd))

    pool = sub.add_parser("pool", help="warm pools: ReplicaSets of idle sandboxes")
    verbs = pool.add_subparsers(dest="pool_cmd", required=True)

    p = verbs.add_parser(
        "create",
        help="create a fixed-size pool (no manager needed)",
        usage="%(prog)s NAME --image IMAGE [options] [-- COMMAND ...]",
    )
    flags(p, cmd_create)
    p.add_argument("name")
    p.add_argument("--image", required=True)
    p.add_argument("--size", type=int, default=1, help="idle pods to keep (default 1)")
    p.add_argument(
        "--ttl", type=durations.lease, help="lease of a claimed pod when the claim gives none"
    )
    p.add_argument("--profile")
    p.add_argument("--node-selector", action="append", default=[], metavar="K=V")
    p.add_argument("--toleration", action="append", default=[], metavar="KEY[=VALUE][:EFFECT]")
    # Also settable after `--` (main() puts that tail into args.command).
    p.add_argument("--command", type=shlex.split, default=[], help='e.g. "sleep infinity"')

    p = verbs.add_parser("ls", help="pools with their live health (computed from their pods)")
    flags(p, cmd_ls)
    add_output_flag(p)
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # = -o json

    p = verbs.add_parser("scale", help="set a pool's size (its ReplicaSet's replicas)")
    flags(p, cmd_scale)
    p.add_argument("name")
    p.add_argument("size", type=int)

    p = verbs.add_parser(
        "delete",
        help="delete a pool and its idle pods; claimed pods live on",
        description="Delete the pool's ReplicaSet; the garbage collector deletes its idle "
        "pods. Claimed pods are not deleted: a claim drops the pod's owner reference, so "
        "they are no longer the pool's. Release them with `sandman release POD`.",
    )
    flags(p, cmd_delete)
    p.add_argument("name")

    p = sub.add_parser(
        "claim",
        help="take one idle sandbox out of a pool; print its name",
        description="Claim an idle pod of POOL (atomically: one claimer wins each pod), "
        "wait until it is Ready and print its name, e.g. "
        "`kubectl sandman exec $(kubectl sandman claim p1) -- echo hi`.",
    )
    flags(p, cmd_claim)
    p.add_argument("pool")
    p.add_argument(
        "--ttl", type=durations.lease, help=f"lease (default: the pool's, else {DEFAULT_CLAIM_TTL})"
    )
    p.add_argument(
        "--wait", type=durations.seconds_or_zero, default=60.0, help="wait for an idle pod (60s)"
    )
    p.add_argument("--ready-only", action="store_true", help="never claim a pod still starting")
    p.add_argument("--timeout", type=durations.seconds, default=300.0, help="wait for Ready (300s)")
    p.add_argument("--claimer", help="recorded on the pod (default: $USER@hostname)")
    p.add_argument(
        "-o",
        "--output",
        type=output_format(ONE_FORMATS),
        choices=Formats(ONE_FORMATS),
        default=None,
        metavar="FORMAT",
        help="name: pod/NAME; json|yaml|jsonpath=TEMPLATE: the claim's details (default: NAME)",
    )


def common_run(args: argparse.Namespace, cmd: Cmd) -> int:
    async def with_namespace(args: argparse.Namespace, client: SandmanClient) -> int:
        args.namespace = client.namespace  # the flag's, else the context's
        return await cmd(args, client)

    return common.run(args, with_namespace)


def pool_arg(name: str) -> str:
    return strip_kind(name, "pool")


async def _on_pool(name: str, ns: str, call: Awaitable[Any]) -> Any:
    """``call`` on the pool's ReplicaSet, with its 404 said in pool terms."""
    try:
        return await call
    except ApiError as e:
        if e.not_found:
            msg = f"no pool {name} in namespace {ns}; create it with `sandman pool create`"
            raise CliError(msg) from None
        raise


async def _get_pool(kube: KubeClient, name: str, ns: str) -> dict[str, Any]:
    return await _on_pool(name, ns, kube.get(REPLICASETS, replicaset_name(name), ns))


def _pairs(items: list[str], what: str) -> dict[str, str]:
    if bad := [s for s in items if "=" not in s]:
        raise CliError(f"{what} {bad[0]!r}: expected KEY=VALUE")
    return dict(s.split("=", 1) for s in items)


def parse_toleration(text: str) -> dict[str, str]:
    """`key=value:Effect`, `key:Effect` or `key` (no value: operator Exists)."""
    body, _, effect = text.partition(":")
    key, eq, value = body.partition("=")
    if not key:
        raise CliError(f"toleration {text!r}: expected KEY[=VALUE][:EFFECT]")
    tol = {"key": key, "operator": "Equal" if eq else "Exists"}
    tol |= {"value": value} if eq else {}
    tol |= {"effect": effect} if effect else {}
    return tol


async def cmd_create(args: argparse.Namespace, client: SandmanClient) -> int:
    args.name = pool_arg(args.name)
    spec = PoolSpec(
        name=args.name,
        image=args.image,
        size=args.size,
        command=args.command or None,
        ttl=args.ttl,
        profile=args.profile,
        node_selector=_pairs(args.node_selector, "node selector") or None,
        tolerations=[parse_toleration(t) for t in args.toleration] or None,
    )
    if args.ttl:
        parse_duration(args.ttl, field="--ttl")  # fail here, not per pod at admission
    try:
        # Admission first: warms the webhook's image cache for the pool's pods,
        # and a refused pod is refused here, with the reason.
        await dry_run_pod(client.kube, spec, args.namespace)
    except PoolRefused as e:
        raise CliError(str(e)) from None
    try:
        await client.kube.create(REPLICASETS, spec.replicaset(), args.namespace)
    except ApiError as e:
        if not e.conflict:
            raise
        raise CliError(
            f"pool {args.name} already exists in namespace {args.namespace}; change its size "
            f"with `sandman pool scale {args.name} N` or remove it with "
            f"`sandman pool delete {args.name}`"
        ) from None
    print(f"pool {args.name} created with {args.size} idle pod(s)", file=sys.stderr)
    return 0


async def _pool_pods(kube: KubeClient, ns: str, pool: str | None = None) -> list[dict[str, Any]]:
    sel = pool_selector(pool, state=None) if pool else LABEL_POOL
    return (await list_all(kube, PODS, ns, label_selector=sel))[0]


def _reason(h: PoolHealth, rs: dict[str, Any]) -> str:
    """Why its pods cannot start, else why the ReplicaSet cannot create any (a
    policy denial or quota leaves no pod to blame)."""
    if h.reasons:
        return f"{', '.join(h.reasons)}: {h.message}".rstrip(": ")
    for c in (rs.get("status") or {}).get("conditions") or []:
        if c.get("type") == "ReplicaFailure" and c.get("status") == "True":
            return f"{c.get('reason', 'ReplicaFailure')}: {c.get('message', '')}"
    return ""


async def cmd_ls(args: argparse.Namespace, client: SandmanClient) -> int:
    kube, ns = client.kube, args.namespace
    sets, _ = await list_all(kube, REPLICASETS, ns, label_selector=LABEL_POOL)
    by_pool: dict[str, list[dict[str, Any]]] = {}
    for pod in await _pool_pods(kube, ns):
        by_pool.setdefault(pod["metadata"]["labels"][LABEL_POOL], []).append(pod)
    rows: list[dict[str, Any]] = []
    for rs in sorted(sets, key=lambda r: r["metadata"]["name"]):
        name, spec = rs["metadata"]["labels"][LABEL_POOL], rs["spec"]
        h = pool_health(by_pool.get(name, []))
        if (why := _reason(h, rs)) and not h.ready:
            h.condition = FAILING  # pool_health sees pods only, not pods never created
        image, size = spec["template"]["spec"]["containers"][0]["image"], spec.get("replicas", 0)
        row = {"name": name, "namespace": ns, "image": image, "size": size, "reason": why}
        row |= {"ttl": template_ttl(rs), "profile": template_ann(rs).get(ANN_PROFILE)}
        rows.append({**row, **h.to_json()})
    emit(rows, POOL_COLUMNS, "json" if args.json else args.output, kind="pool")
    return 0


def template_ann(rs: dict[str, Any]) -> dict[str, str]:
    return dict(rs["spec"]["template"]["metadata"].get("annotations") or {})


def template_ttl(rs: dict[str, Any]) -> str | None:
    return template_ann(rs).get(ANN_TTL)


POOL_COLUMNS = [
    Column("NAME", "name"),
    Column("IMAGE", "image"),
    Column("SIZE", "size"),
    Column("IDLE-READY", "ready"),
    Column("STARTING", "starting"),
    Column("FAILING", "failing"),
    Column("CLAIMED", "claimed"),
    Column("CONDITION", "condition"),
    Column("REASON", "reason", show=lambda v: (v or "")[:80]),
    Column("TTL", "ttl", wide=True),
    Column("PROFILE", "profile", wide=True),
]


async def cmd_scale(args: argparse.Namespace, client: SandmanClient) -> int:
    if args.size < 0:
        raise CliError(f"size must be >= 0, got {args.size}")
    args.name = pool_arg(args.name)
    patch = [{"op": "replace", "path": "/spec/replicas", "value": args.size}]
    rs_name, ns = replicaset_name(args.name), args.namespace
    await _on_pool(args.name, ns, client.kube.patch(REPLICASETS, rs_name, patch, ns))
    print(f"pool {args.name} scaled to {args.size}", file=sys.stderr)
    return 0


async def cmd_delete(args: argparse.Namespace, client: SandmanClient) -> int:
    args.name = pool_arg(args.name)
    rs_name, ns = replicaset_name(args.name), args.namespace
    # Background: the ReplicaSet goes now, the garbage collector takes its pods.
    delete = client.kube.delete(REPLICASETS, rs_name, ns, propagation_policy="Background")
    await _on_pool(args.name, ns, delete)
    print(f"pool {args.name} deleted (claimed pods are kept)", file=sys.stderr)
    return 0


def _no_idle(pool: str, rs: dict[str, Any], h: PoolHealth, waited: float) -> CliError:
    size, why = int(rs["spec"].get("replicas", 0)), _reason(h, rs)
    return CliError(
        f"pool {pool} has no idle pod: {h.ready} ready, {h.starting} starting, "
        f"{h.failing} failing{f' ({why})' if why else ''}; size {size}, {h.claimed} claimed "
        f"(waited {waited:.0f}s)"
        + (f"; grow it with `sandman pool scale {pool} N`" if size == 0 else "")
    )


async def cmd_claim(args: argparse.Namespace, client: SandmanClient) -> int:
    kube, ns, pool = client.kube, args.namespace, pool_arg(args.pool)
    rs = await _get_pool(kube, pool, ns)
    template_ann = rs["spec"]["template"]["metadata"].get("annotations") or {}
    ttl = parse_duration(args.ttl or template_ann.get(ANN_TTL) or DEFAULT_CLAIM_TTL, field="--ttl")
    user = os.environ.get("USER") or getpass.getuser()
    claimer = args.claimer or f"{user}@{socket.gethostname()}"
    opts: dict[str, Any] = {"claimer": claimer, "ttl": ttl, "ready_only": args.ready_only}
    t0 = time.monotonic()
    said = False
    while True:
        # One list serves both the claim's candidates and the health we report.
        pods = await _pool_pods(kube, ns, pool)
        try:
            res = await claim(kube, ns, pool, candidates=pods, **opts)
            break
        except NoIdlePod:
            pass
        waited = time.monotonic() - t0
        h = pool_health(pods)
        # Waiting is pointless when nothing will refill the pool or every pod it
        # has cannot start; otherwise wait for the ReplicaSet to catch up.
        hopeless = not rs["spec"].get("replicas") or (h.condition == FAILING and not h.starting)
        if hopeless or waited >= args.wait:
            raise _no_idle(pool, rs, h, waited)
        if not said:
            print(f"pool {pool}: no idle pod yet; waiting up to {args.wait:.0f}s", file=sys.stderr)
            said = True
        await asyncio.sleep(POLL_S)
        rs = await _get_pool(kube, pool, ns)  # deleted or scaled meanwhile?
    sb = Sandbox(client, res.pod)
    if not res.ready:
        try:
            await sb.wait_ready(args.timeout)
        except SandboxStartError as e:
            # The pod is ours now, not the pool's: do not leave it behind.
            await sb.release()
            raise CliError(
                f"claimed {sb.name} from pool {pool} but it did not start: "
                f"{e.reason}: {e.message} (released it)"
            ) from None
    md = sb.pod["metadata"]
    doc = {
        "name": sb.name,
        "namespace": sb.namespace,
        "pool": pool,
        "id": md["labels"].get(LABEL_ID),
        "expires_at": md["annotations"].get(ANN_EXPIRES_AT),
        "warm": res.ready,  # Ready when claimed, not still starting
        "conflicts": res.conflicts,
        "claim_s": round(time.monotonic() - t0, 3),
    }
    if not emit_one(doc, args.output, kind="pod"):
        print(f"pod/{sb.name}" if args.output == "name" else sb.name)
    return 0
