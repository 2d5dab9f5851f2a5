"""Entry point of `sandman` and `kubectl-sandman`.

Each command's module is imported only when that command runs: the harness,
the benchmarks and the components pull in heavy dependencies (the official
Kubernetes client, prometheus, cryptography) that `sandman exec` or
`kubectl sandman claim` must not wait for.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from sandman import __version__

# command -> (module with add_parser(s)(sub), one-line help for `sandman --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("sandman.cli.sandboxes", "create a sandbox from an image and print its pod name"),
    "exec": ("sandman.cli.sandboxes", "run a command in a sandbox (exit code propagates)"),
    "shell": ("sandman.cli.sandboxes", "an interactive shell in a sandbox"),
    "cp": ("sandman.cli.sandboxes", "copy files to or from a sandbox"),
    "ls": ("sandman.cli.sandboxes", "list sandboxes"),
    "extend": ("sandman.cli.sandboxes", "extend a sandbox's lease"),
    "release": ("sandman.cli.sandboxes", "release (delete) sandboxes"),
    "token": ("sandman.cli.sandboxes", "print a sandbox's access token"),
    "ps": ("sandman.cli.sandboxes", "a sandbox's background processes"),
    "logs": ("sandman.cli.sandboxes", "a background process's output (or the container log)"),
    "port-forward": ("sandman.cli.sandboxes", "forward local ports to ports inside a sandbox"),
    "pool": ("sandman.cli.pools", "warm pools: create, ls, scale, delete"),
    "claim": ("sandman.cli.pools", "claim a sandbox from a warm pool"),
    "completion": ("sandman.cli.completion", "print the shell completion script (bash, zsh)"),
    "fleet": ("sandman.cli.fleet", "run a batch of rollouts (results stream as JSON lines)"),
    "eval": ("sandman.cli.eval", "score agents on a benchmark spec under controlled conditions"),
    "e2b-gateway": (
        "sandman.adapters.e2b.cli",
        "serve E2B's API over Sandman sandboxes (point E2B's SDK at it)",
    ),
    "install": ("sandman.install.cli", "install Sandman on a cluster (kustomize overlay, applied)"),
    "uninstall": ("sandman.install.cli", "remove Sandman (webhook configurations first)"),
    "policy": ("sandman.cli.policy", "check a sandbox policy file offline, as the webhook would"),
    "cluster": ("sandman.harness.cli.cluster", "the local cluster (dev harness)"),
    "image": ("sandman.harness.cli.image", "build and push Sandman's images (no Docker needed)"),
    "demo": ("sandman.harness.cli.demo", "run a demo batch of sandboxes on the local cluster"),
    "bench": ("sandman.bench.cli", "run a benchmark (brings up the cluster it needs)"),
    "webhook": ("sandman.webhook.cli", "the admission webhook (daemon injection and policy)"),
    "reaper": ("sandman.reaper.cli", "reclaims sandboxes whose lease ended"),
    "extender": ("sandman.extender.cli", "the scheduler extender (image-cache-aware placement)"),
}


def prog_name(argv0: str) -> str:
    """``kubectl sandman`` when kubectl ran us as its plugin (``kubectl-sandman``),
    so that help and usage lines show what the user typed; else ``sandman``."""
    base = os.path.basename(argv0)
    if base.startswith("kubectl-"):
        return "kubectl " + base.removeprefix("kubectl-").replace("_", "-")
    return "sandman"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with ``command`` fully registered and every other one as a stub."""
    parser = argparse.ArgumentParser(
        prog=prog_name(sys.argv[0]),
        description="Kubernetes-native sandboxes for agentic RL: clients just create labeled pods.",
    )
    parser.add_argument("--version", action="version", version=f"sandman {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    registered: set[str] = set()
    if command in COMMANDS:
        module = _import(COMMANDS[command][0])
        before = set(sub.choices)
        register = getattr(module, "add_parsers", None) or module.add_parser
        try:
            register(sub)  # some import their subcommands' modules here (`bench`)
        except ImportError as e:
            raise SystemExit(missing_module_advice(COMMANDS[command][0], e.name)) from None
        registered = set(sub.choices) - before
    for name, (_module, help_text) in COMMANDS.items():
        if name not in registered:
            sub.add_parser(name, help=help_text)
    return parser


# Top-level module -> (distribution, extra of sandman-k8s that installs it;
# "" for the core dependencies). A unit test keeps it in step with
# pyproject.toml's dependencies and extras.
MODULE_EXTRAS: dict[str, tuple[str, str]] = {
    "aiohttp": ("aiohttp", ""),
    "yaml": ("PyYAML", ""),
    "kubernetes": ("kubernetes", ""),
    "prometheus_client": ("prometheus-client", "server"),
    "cryptography": ("cryptography", "server"),
    "swerex": ("swe-rex", "swerex"),
    "e2b": ("e2b", "e2b"),
    "gymnasium": ("gymnasium", "gym"),
    "matplotlib": ("matplotlib", "plot"),
    "opentelemetry": ("opentelemetry-sdk", "otel"),
    "pytest": ("pytest", "dev"),
}


def missing_module_advice(module: str, missing: str | None) -> str:
    """What to tell a user whose command ``module`` failed to import ``missing``.

    Never an install that cannot help: a module of Sandman's own that is not
    there is a broken installation (no extra adds it); a dependency is named
    with the extra that installs it; anything else is named as it is.
    """
    if not missing:
        return f"sandman: this command cannot load {module} (an import failed)"
    top = missing.split(".", 1)[0]
    if top == "sandman":
        return (
            f"sandman: sandman-k8s {__version__} is installed without its own module "
            f"{missing} (needed by {module}); no extra provides it. A damaged install is "
            f"repaired by reinstalling the same version; a fresh install that lacks it is "
            "a packaging bug"
        )
    if top in MODULE_EXTRAS:
        dist, extra = MODULE_EXTRAS[top]
        if not extra:
            return (
                f"sandman: this command needs {dist} (module {missing}), a dependency of "
                f"sandman-k8s that is not installed: pip install 'sandman-k8s' installs it"
            )
        return (
            f"sandman: this command needs {dist} (module {missing}), which sandman-k8s's "
            f"[{extra}] extra installs: pip install 'sandman-k8s[{extra}]'"
        )
    return (
        f"sandman: this command needs the Python module {missing}, which is not installed "
        "(no sandman-k8s extra provides it)"
    )


def _import(module: str):  # type: ignore[no-untyped-def]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise SystemExit(missing_module_advice(module, e.name)) from None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["__complete"]:  # what the completion scripts call (hidden)
        from sandman.cli.completion import complete_main

        return complete_main(argv[1:])
    # `sandman run IMAGE -- CMD...` / `sandman exec POD -- CMD...`: what follows
    # `--` is the command, verbatim. Split it off here: argparse's own `--`
    # handling does not work across subcommands.
    tail: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, tail = argv[:cut], argv[cut + 1 :]
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command)
    args = parser.parse_args(argv)
    if tail:
        if not hasattr(args, "command"):
            parser.error("`--` is only for `run`, `exec` and `pool create`")
        args.command = tail
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    if not hasattr(args, "func") and getattr(args, "sandbox_cmd", None) is None:
        parser.parse_args([args.cmd, "--help"])
    try:
        if getattr(args, "sandbox_cmd", None) is not None:
            from sandman.cli.sandboxes import run_sandbox_command

            return run_sandbox_command(args)
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as e:  # a dependency imported only when the command runs
        raise SystemExit(missing_module_advice(COMMANDS[args.cmd][0], e.name)) from None
    except Exception as e:
        # One line and Sandman's exit code for every failure that is not a bug
        # (no kubeconfig, no apiserver, a refusal, an answer that is not JSON);
        # -v adds the traceback (sandman.cli.common.explain, docs/cli.md).
        from sandman.cli.common import report

        return report(e, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
