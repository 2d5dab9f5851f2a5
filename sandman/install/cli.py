"""`sandman install` / `sandman uninstall`: Sandman on an existing cluster.

    sandman install --registry ghcr.io/myorg --allow-registry 'docker.io/*'
                                      # write ./sandman-overlay, apply, wait
    sandman install --registry R --policy my-policy.yaml --dry-run=client -o yaml
                                      # print what would be applied
    kubectl apply --server-side -k ./sandman-overlay    # the same, by hand or GitOps
    sandman uninstall                                   # webhook configurations first

The images must be in the registry already: `sandman image push --registry R`
from a checkout (same version by default), or a published release.

Sandboxes may run images only from the registries the policy allows, and
the install makes you choose them: --allow-registry GLOB (repeatable) or
--policy FILE (docs/policy.md). A policy that admits nothing outside the
local harness's 127.0.0.1:5000 is refused unless --local-harness.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from sandman import __version__
from sandman.cli.policy import LOCAL_HARNESS_HELP
from sandman.contract import NAMESPACE
from sandman.install import apply as ap
from sandman.install import kubeversion, pullsecrets, render
from sandman.install import policy as install_policy
from sandman.install.images import ImageNameError, Registry

DEFAULT_OVERLAY = Path("sandman-overlay")


def _kubectl_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", default=None, help="as kubectl's (default: $KUBECONFIG)")
    p.add_argument("--context", default=None, help="kubeconfig context (default: current)")
    p.add_argument("--kubectl", default="kubectl", help="kubectl to run (default: on PATH)")


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "install",
        help="install Sandman on a cluster (writes a kustomize overlay, applies it, waits)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--registry",
        default=None,
        help="REGISTRY[/PREFIX] holding the sandman-* images; omit for bare names "
        "(sandman-controller:V, e.g. after `kind load`)",
    )
    p.add_argument("--version", default=__version__, help=f"image tag (default {__version__})")
    p.add_argument(
        "--cert-manager",
        action="store_true",
        help="the webhook's TLS from cert-manager (Certificate + inject-ca-from) instead of "
        "its own",
    )
    p.add_argument(
        "--monitoring",
        action="store_true",
        help="also the Prometheus Operator objects and the Grafana dashboard "
        "(manifests/monitoring; the operator's CRDs must be installed)",
    )
    p.add_argument(
        "--delivery",
        choices=render.DELIVERIES,
        default=render.DEFAULT_DELIVERY,
        help="how the daemon reaches sandboxes (docs/install.md): copy = into each pod "
        "(default), shared = once per node, node = the node installer DaemonSet, the only "
        "one that runs a (privileged-namespace) pod on every node",
    )
    p.add_argument(
        "--scheduler-image",
        default=None,
        metavar="NAME:TAG",
        help="a kube-scheduler for the cluster's Kubernetes minor, the tag naming its "
        f"version (e.g. {kubeversion.UPSTREAM}:v1.33.9); default: the release's "
        f"sandman-scheduler, kube-scheduler {'.'.join(map(str, kubeversion.SCHEDULER_MINOR))}",
    )
    p.add_argument(
        "--allow-registry",
        action="append",
        default=[],
        metavar="GLOB",
        help="sandboxes may run images matching GLOB, as the runtime names them "
        "(docker.io/*, ghcr.io/ORG/*, ACCOUNT.dkr.ecr.REGION.amazonaws.com/*); repeatable; "
        "the release's policy with these registries",
    )
    p.add_argument(
        "--policy",
        type=Path,
        default=None,
        metavar="FILE",
        help="install this SandboxPolicy (or ConfigMap manifest holding one) instead",
    )
    p.add_argument("--local-harness", action="store_true", help=LOCAL_HARNESS_HELP)
    p.add_argument(
        "--image-pull-secret",
        action="append",
        default=[],
        metavar="NAME",
        help="a dockerconfigjson Secret in sandman-system for pulling Sandman's images, "
        "named by every Sandman pod; sandboxes name it too (for the daemon image), so "
        "create it in sandbox namespaces as well (docs/install.md); repeatable",
    )
    p.add_argument(
        "--registry-auth",
        type=Path,
        default=None,
        metavar="FILE",
        help="a docker config.json with the registry's login: applied as the Secret "
        f"{NAMESPACE}/{pullsecrets.REGISTRY_AUTH_SECRET} (never written to the overlay "
        "or printed) and used like --image-pull-secret",
    )
    p.add_argument(
        "--overlay-dir",
        type=Path,
        default=None,
        help=f"where to write the overlay (default ./{DEFAULT_OVERLAY}; a temporary dir "
        "with --dry-run=client)",
    )
    p.add_argument("--force", action="store_true", help="overwrite a kustomization not ours")
    p.add_argument(
        "--dry-run",
        choices=("none", "client", "server"),
        nargs="?",
        const="client",  # a bare --dry-run, as kubectl reads it
        default="none",
        help="client (also a bare --dry-run): print the objects, touch nothing; "
        "server: the apiserver validates",
    )
    p.add_argument("-o", "--output", choices=("name", "yaml"), default="name")
    p.add_argument(
        "--force-conflicts",
        action="store_true",
        help="take back fields changed in the cluster since the last apply (e.g. a policy "
        "edited live: reset to the overlay's)",
    )
    p.add_argument("--no-wait", action="store_true", help="do not wait for the rollout")
    _kubectl_flags(p)
    p.set_defaults(func=cmd_install)

    u = sub.add_parser(
        "uninstall",
        help="remove Sandman (webhook configurations first; sandboxes are left running)",
    )
    u.add_argument(
        "--overlay-dir",
        type=Path,
        default=None,
        help="the overlay `sandman install` wrote (default: this release's manifests)",
    )
    u.add_argument(
        "--purge-access-secrets",
        action="store_true",
        help="also delete the sandman-access Secret the webhook put in each namespace",
    )
    _kubectl_flags(u)
    u.set_defaults(func=cmd_uninstall)


def _kubectl(args: argparse.Namespace) -> ap.Kubectl:
    return ap.Kubectl(args.kubectl, args.kubeconfig, args.context)


def cmd_install(args: argparse.Namespace) -> int:
    try:
        chosen = install_policy.choose(
            args.allow_registry, args.policy, local_harness=args.local_harness
        )
    except install_policy.PolicyChoiceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        auth_secret, pull_names = _pull_secrets(args)
    except (OSError, pullsecrets.PullSecretError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        opts = render.InstallOptions(
            image_pull_secrets=pull_names,
            policy=chosen.text,
            version=args.version,
            registry=Registry.parse(args.registry) if args.registry else None,
            cert_manager=args.cert_manager,
            delivery=args.delivery,
            scheduler_image=args.scheduler_image,
            monitoring=args.monitoring,
        )
        render.images(opts)  # a bad version fails here, before anything is written
        if args.scheduler_image:  # its tag must say which Kubernetes it is for
            kubeversion.image_minor(args.scheduler_image)
    except (ImageNameError, kubeversion.VersionError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    kubectl = _kubectl(args)
    if shutil.which(args.kubectl) is None:  # before anything is written
        print(
            f"error: {args.kubectl} not found: `sandman install` renders its overlay with "
            "kubectl's kustomize and applies it with kubectl (even --dry-run=client needs "
            "it); install kubectl (https://kubernetes.io/docs/tasks/tools/) or pass "
            "--kubectl PATH",
            file=sys.stderr,
        )
        return 1
    tmp = None
    try:
        if args.dry_run != "client":  # the client dry run needs no cluster
            verdict = kubeversion.check(ap.server_version(kubectl), args.scheduler_image)
            print(verdict.message, file=sys.stderr)
            if not verdict.ok:
                print("error: not installed (nothing was written or applied)", file=sys.stderr)
                return 1
        if args.overlay_dir is None and args.dry_run == "client":
            tmp = tempfile.TemporaryDirectory(prefix="sandman-overlay-")
            overlay = Path(tmp.name)
        else:
            overlay = args.overlay_dir or DEFAULT_OVERLAY
        ap.write_overlay(overlay, opts, force=args.force)
        rendered = ap.render_overlay(kubectl, overlay)
        docs = ap.documents(rendered)
        for line in chosen.lines:  # what the webhook will apply: mode, registries
            print(line, file=sys.stderr)
        if pull_names:
            print(
                f"image pull secrets: {', '.join(pull_names)} (in {NAMESPACE} for Sandman's "
                "pods; sandboxes name them for the daemon image: create them in sandbox "
                "namespaces too)",
                file=sys.stderr,
            )
        if args.dry_run == "client":
            if args.output == "yaml":
                print(rendered, end="")
            else:
                for d in docs:
                    print(f"{d['kind'].lower()}/{d['metadata']['name']} (dry run)")
            return 0
        print(f"overlay: {overlay}/ (kubectl apply --server-side -k {overlay})", file=sys.stderr)
        if auth_secret is not None and args.dry_run == "none":
            ap.apply_secret(kubectl, docs, auth_secret)
            print(
                f"pull secret: {NAMESPACE}/{pullsecrets.REGISTRY_AUTH_SECRET} from "
                f"{args.registry_auth}",
                file=sys.stderr,
            )
        out = ap.apply(
            kubectl,
            overlay,
            server_dry_run=args.dry_run == "server",
            force_conflicts=args.force_conflicts,
        )
        print(out, end="")
        if args.dry_run == "server" or args.no_wait:
            return 0
        ap.wait_available(kubectl, docs, progress=lambda m: print(m, file=sys.stderr))
        ap.verify_injection(kubectl, ap.daemon_image(docs))
        print("Sandman is installed: labeled pods get the daemon.", file=sys.stderr)
        return 0
    except ap.InstallError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        if tmp is not None:
            tmp.cleanup()


def _pull_secrets(args: argparse.Namespace) -> tuple[dict[str, Any] | None, tuple[str, ...]]:
    """The --registry-auth Secret (None without) and every pull Secret's name."""
    names = list(args.image_pull_secret)
    secret = None
    if args.registry_auth is not None:
        text = args.registry_auth.read_text()
        secret = pullsecrets.registry_auth_secret(text, str(args.registry_auth))
        names.append(pullsecrets.REGISTRY_AUTH_SECRET)
    return secret, pullsecrets.check_names(names)


def cmd_uninstall(args: argparse.Namespace) -> int:
    kubectl = _kubectl(args)
    try:
        if args.overlay_dir is not None:
            docs = ap.documents(ap.render_overlay(kubectl, args.overlay_dir))
        else:
            docs = ap.release_documents(kubectl)
        ap.uninstall(
            kubectl,
            docs,
            purge_access=args.purge_access_secrets,
            progress=lambda m: print(m, file=sys.stderr),
        )
    except ap.InstallError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
