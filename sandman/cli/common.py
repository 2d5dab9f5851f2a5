"""What every cluster-facing command shares: kubectl's flags, the client, the errors.

`--kubeconfig`, `--context` and `-n/--namespace` mean what they mean to
kubectl (sandman.kube_async.load_credentials), and a failure is one line on
stderr naming what to fix, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable

from sandman.client import SandboxStartError, SandmanClient, SandmanError
from sandman.kube_async import ApiError, KubeClient, KubeconfigError

# Exit codes: a command run in a sandbox passes its own code through `exec`,
# so the CLI's own failures keep to a few fixed values.
EXIT_ERROR = 1  # bad input, the API refused, no cluster
EXIT_SANDBOX = 2  # the daemon refused or is unreachable
EXIT_START = 3  # the sandbox did not start

Cmd = Callable[[argparse.Namespace, SandmanClient], Awaitable[int]]


class CliError(Exception):
    """Reported as one line on stderr, exit code 1."""


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


def api_message(e: ApiError) -> str:
    msg = str(e.body.get("message") or e)
    if e.status == 403:
        return f"forbidden: {msg} (ask for the sandman-user role in this namespace)"
    if e.status == 401:
        return f"unauthorized: the apiserver refused the kubeconfig's credentials ({msg})"
    return f"{msg} (HTTP {e.status})"


def run(args: argparse.Namespace, cmd: Cmd) -> int:
    """Open a client as the flags say, run ``cmd``, map failures to one line."""

    async def main() -> int:
        async with client_for(args) as client:
            return await cmd(args, client)

    def fail(code: int, msg: str) -> int:
        print(f"error: {msg}", file=sys.stderr)
        return code

    try:
        return asyncio.run(main())
    except SandboxStartError as e:
        retry = "retryable" if e.retryable else "not retryable"
        return fail(EXIT_START, f"sandbox did not start: {e.reason}: {e.message} ({retry})")
    except SandmanError as e:
        return fail(EXIT_SANDBOX, str(e))
    except (CliError, KubeconfigError, ValueError) as e:
        # ValueError: a bad name, size or duration.
        return fail(EXIT_ERROR, str(e))
    except ApiError as e:
        return fail(EXIT_ERROR, api_message(e))
    except OSError as e:  # aiohttp's connection errors are OSErrors too
        return fail(EXIT_ERROR, f"cannot reach the apiserver: {e}")
