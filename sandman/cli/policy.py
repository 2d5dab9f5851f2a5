"""`sandman policy check FILE`: a sandbox policy read offline, as the webhook reads it.

    sandman policy check policy.yaml                       # parse errors, warnings, summary
    sandman policy check policy.yaml --image python:3.11   # admitted? by which pattern?
    sandman policy check cm.yaml --image ghcr.io/acme/t:1 --profile eval \\
        --namespace-labels team=research                   # as the webhook would decide there

FILE is a SandboxPolicy (docs/policy.md) or a ConfigMap manifest holding one
under ``policy.yaml``; ``-`` reads standard input. The parser, the checks and
the messages are the webhook's own (imported when this command runs, as
every component is). Exit status: 0 the policy is fine (and each --image is
admitted), 1 a problem (the webhook would reject the policy, it admits
nothing outside the local harness's loopback registry, or an --image is
denied), 2 a usage error or an unreadable file.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

# The webhook's policy reader and report (sandman.webhook is a component:
# the library names it as a string, imported when the command runs).
REPORT_MODULE = "sandman.webhook.policy_report"
EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2
LOCAL_HARNESS_HELP = (
    "the cluster is Sandman's local harness (`make up`): a policy that admits images only "
    "from its loopback registry 127.0.0.1:5000 is intended"
)


def report() -> ModuleType:
    return importlib.import_module(REPORT_MODULE)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "policy",
        help="check a sandbox policy file offline, as the webhook reads it",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    psub = p.add_subparsers(dest="policy_cmd", required=True, metavar="SUBCOMMAND")
    c = psub.add_parser(
        "check",
        help="parse a policy with the webhook's rules; say whether an image is admitted",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("file", help="a SandboxPolicy file or a ConfigMap manifest; - for stdin")
    c.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="IMAGE",
        help="say whether a sandbox of IMAGE is admitted, and by which pattern (repeatable)",
    )
    c.add_argument("--profile", default=None, help="the sandbox's sandman.dev/profile")
    c.add_argument(
        "--namespace-labels",
        default=None,
        metavar="K=V[,K=V]",
        help="the namespace's labels: only the rule set governing it decides (default: "
        "every rule set a namespace can get)",
    )
    c.add_argument("--local-harness", action="store_true", help=LOCAL_HARNESS_HELP)
    c.set_defaults(func=cmd_check)


def parse_labels(text: str) -> dict[str, str]:
    """``a=b,c=d`` -> {"a": "b", "c": "d"}; ValueError for an item without ``=``."""
    out: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"{item!r} is not KEY=VALUE")
        out[key] = value
    return out


def read_source(name: str) -> str:
    return sys.stdin.read() if name == "-" else Path(name).read_text()


def check_text(
    text: str,
    *,
    images: Sequence[str] = (),
    profile: str | None = None,
    namespace_labels: dict[str, str] | None = None,
    local_harness: bool = False,
) -> tuple[int, list[str]]:
    """(exit status, lines to print) for a policy's text: the whole command, minus I/O."""
    r = report()
    try:
        policy = r.load(text)
    except r.PolicyError as e:
        return EXIT_PROBLEM, [
            f"error: the webhook would reject this policy (and keep the previous one): {e}"
        ]
    status = EXIT_OK
    lines = [f"policy: {len(policy.rules)} rule set(s)"]
    lines += [f"  {s}" for s in r.summary(policy)]
    lines += [f"warning: {w}" for w in r.warnings(policy, local_harness=local_harness)]
    if r.admits_only_loopback(policy) and not local_harness:
        status = EXIT_PROBLEM
        lines.append(
            "error: this policy admits no image from outside a loopback registry: on any "
            "cluster but the local harness every sandbox would be denied (add your registries "
            "to allowedRegistries, or pass --local-harness if this is the local harness)"
        )
    for image in images:
        for v in r.image_verdicts(policy, image, profile, namespace_labels):
            lines.append(f"{image}: {v.message}")
            if not v.admitted:
                status = EXIT_PROBLEM
    return status, lines


def cmd_check(args: argparse.Namespace) -> int:
    try:
        labels = parse_labels(args.namespace_labels) if args.namespace_labels is not None else None
    except ValueError as e:
        print(f"error: --namespace-labels: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        text = read_source(args.file)
    except (OSError, UnicodeDecodeError) as e:
        print(f"error: cannot read {args.file}: {e}", file=sys.stderr)
        return EXIT_USAGE
    status, lines = check_text(
        text,
        images=args.image,
        profile=args.profile,
        namespace_labels=labels,
        local_harness=args.local_harness,
    )
    for line in lines:
        print(line, file=sys.stderr if line.startswith(("error:", "warning:")) else sys.stdout)
    return status
