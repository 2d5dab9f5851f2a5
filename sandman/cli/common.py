"""What every cluster-facing command shares: kubectl's flags, the client, the errors.

`--kubeconfig`, `--context` and `-n/--namespace` mean what they mean to
kubectl (sandman.kube_async.load_credentials), and a failure is one line on
stderr naming what to fix, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import sys
import traceback
from collections.abc import Awaitable, Callable

import aiohttp

from sandman.client import DaemonError, SandboxStartError, SandmanClient, SandmanError
from sandman.kube_async import ApiError, KubeClient, KubeconfigError

# Exit codes (docs/cli.md), as container CLIs keep them: a command run in a
# sandbox passes its own code through `exec` unchanged, so the CLI's own
# outcomes keep to codes a command is unlikely to use for itself.
EXIT_SOME_FAILED = 1  # a batch ran (fleet run) but some of it failed on the infrastructure
EXIT_USAGE = 2  # argparse: a bad flag or argument (nothing was sent anywhere)
EXIT_TIMEOUT = 124  # exec --timeout ran out (as timeout(1))
EXIT_SANDMAN = 125  # Sandman failed: no cluster, refused, no such sandbox, did not start
EXIT_CANNOT_RUN = 126  # exec: the command exists but cannot be started (permissions, cwd)
EXIT_NOT_FOUND = 127  # exec: no such command in the sandbox
EXIT_INTERRUPTED = 130  # Ctrl-C

Cmd = Callable[[argparse.Namespace, SandmanClient], Awaitable[int]]


class CliError(Exception):
    """Reported as one line on stderr, exit code 125."""


class UsageError(CliError):
    """Arguments that do not go together (what argparse cannot check): exit code 2."""


def add_kube_flags(p: argparse.ArgumentParser, *, transport: bool = False) -> None:
    g = p.add_argument_group("cluster (as kubectl)")
    g.add_argument(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)"
    )
    g.add_argument("--context", help="kubeconfig context (default: its current-context)")
    g.add_argument("-n", "--namespace", help="default: the context's namespace")
    if transport:
        g.add_argument(
            "--transport",
            choices=["auto", "direct", "proxy"],
            default="auto",
            help="reach the daemon at the pod IP (direct) or through the apiserver's "
            "pods/proxy (proxy); auto: direct when the pod IP answers",
        )


def client_for(args: argparse.Namespace) -> SandmanClient:
    kube = KubeClient.from_kubeconfig(
        args.kubeconfig, context=args.context, user_agent="sandman-cli"
    )
    return SandmanClient(
        kube=kube, namespace=args.namespace, transport=getattr(args, "transport", "auto")
    )


# `pods is forbidden: User "u" cannot list resource "pods" in API group "" in
# the namespace "ns"`: the apiserver's own words for an RBAC refusal.
_RBAC = re.compile(
    r'User "(?P<user>[^"]*)" cannot (?P<verb>\S+) resource "(?P<resource>[^"]*)"'
    r'(?: in API group "(?P<group>[^"]*)")?'
    r'(?: in the namespace "(?P<ns>[^"]*)"| at the cluster scope)?'
)


def is_policy_denial(message: str) -> bool:
    """An admission webhook's refusal (Sandman's policy), not RBAC's."""
    return "admission webhook" in message and "denied the request" in message


def forbidden_message(message: str) -> str:
    """A 403 in words: a policy denial with its rule, or a permission (RBAC)
    problem naming the verb, resource and namespace. Never the one for the other.

    >>> forbidden_message('pods is forbidden: User "alice" cannot list resource "pods" '
    ...                   'in API group "" in the namespace "team-b"')
    'permission denied: alice may not list pods in namespace team-b (Kubernetes RBAC; ask \
for the sandman-user role there)'
    >>> forbidden_message('admission webhook "policy.sandman.dev" denied the request: '
    ...                   'image evil.io/x: registry not allowed (rule allowedRegistries)')
    'denied by policy: image evil.io/x: registry not allowed (rule allowedRegistries) \
(webhook policy.sandman.dev)'
    """
    if is_policy_denial(message):
        hook, _, rule = message.partition("denied the request:")
        name = hook.replace("admission webhook", "").strip().strip('"')
        return f"denied by policy: {rule.strip()} (webhook {name})"
    m = _RBAC.search(message)
    if not m:
        return f"permission denied: {message} (Kubernetes RBAC)"
    resource = m["resource"] + (f".{m['group']}" if m["group"] else "")
    where = f"in namespace {m['ns']}" if m["ns"] else "at the cluster scope"
    return (
        f"permission denied: {m['user']} may not {m['verb']} {resource} {where} "
        "(Kubernetes RBAC; ask for the sandman-user role there)"
    )


def api_message(e: ApiError) -> str:
    body = e.body if isinstance(e.body, dict) else {}
    msg = str(body.get("message") or e)
    if e.status == 403:
        return forbidden_message(msg)
    if e.status == 401:
        return f"unauthorized: the apiserver refused the kubeconfig's credentials ({msg})"
    if e.not_found:
        return f"not found: {msg}"
    return f"{msg} (HTTP {e.status})"


def explain(e: BaseException) -> tuple[int, str] | None:
    """(exit code, one line) for a failure the CLI reports without a
    traceback; None for a bug (which keeps its traceback)."""
    if isinstance(e, SandboxStartError):
        if e.reason in (SandboxStartError.POLICY_DENIED, SandboxStartError.FORBIDDEN):
            return EXIT_SANDMAN, f"sandbox not created: {forbidden_message(e.message)}"
        retry = "retryable" if e.retryable else "not retryable"
        return EXIT_SANDMAN, f"sandbox did not start: {e.reason}: {e.message} ({retry})"
    if isinstance(e, ApiError):  # before SandmanError: the SDK's KubernetesError is both
        return EXIT_SANDMAN, api_message(e)
    if isinstance(e, DaemonError) and e.code in ("cannot_start", "no_shell", "bad_cwd"):
        # The daemon could not start the command: 127 when it does not exist, as a shell says.
        missing = e.code == "no_shell" or "No such file" in e.message
        return (EXIT_NOT_FOUND if missing else EXIT_CANNOT_RUN), e.message
    if isinstance(e, UsageError):
        return EXIT_USAGE, str(e)
    if isinstance(e, (SandmanError, CliError, KubeconfigError)):
        return EXIT_SANDMAN, str(e)
    if isinstance(e, json.JSONDecodeError):
        return EXIT_SANDMAN, (
            "the apiserver's answer is not JSON (is the kubeconfig's server a Kubernetes "
            f"apiserver, not a proxy or login page?): {e}"
        )
    if isinstance(e, aiohttp.ClientError | ConnectionError | socket.gaierror | TimeoutError):
        return EXIT_SANDMAN, f"cannot reach the apiserver: {e or type(e).__name__}"
    if isinstance(e, (ValueError, OSError)):  # a bad name, size or duration; a local file
        return EXIT_SANDMAN, str(e)
    return None


def report(e: BaseException, verbose: bool) -> int:
    """Print ``e`` as one line (and its traceback with -v); the exit code."""
    said = explain(e)
    if said is None:
        raise e
    if verbose:
        traceback.print_exception(e, file=sys.stderr)
    print(f"error: {said[1]}", file=sys.stderr)
    return said[0]


def run(args: argparse.Namespace, cmd: Cmd) -> int:
    """Open a client as the flags say, run ``cmd``, map failures to one line."""

    async def main() -> int:
        async with client_for(args) as client:
            return await cmd(args, client)

    try:
        return asyncio.run(main())
    except Exception as e:
        return report(e, bool(getattr(args, "verbose", False)))
