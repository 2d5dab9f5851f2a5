"""`sandman image ...`: build our images without Docker, push them to any registry."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from sandman.harness.cluster.binaries import BuildError
from sandman.harness.cluster.config import ClusterConfig
from sandman.harness.images import components, needs
from sandman.harness.images.build import (
    DEFAULT_REGISTRY,
    IMAGE_NAMES,
    ImageBuilder,
    ImageBuildError,
    image_ref,
    recipe,
)
from sandman.harness.images.controller import ControllerBuildError
from sandman.harness.images.daemon_binary import DaemonBuildError
from sandman.harness.images.push import PushError, PushOptions, export_archive, push
from sandman.harness.images.pybase import PyBaseError
from sandman.harness.images.registry import Registry as LoopbackRegistry
from sandman.harness.images.registry import RegistryError
from sandman.install.images import COMPONENTS, ImageNameError, Registry

VERSION_HELP = (
    "the one version that tags every component image (default: the release, "
    f"{components.RELEASE}; `dev`: {components.RELEASE}-dev.<content digest>)"
)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("image", help="build and push Sandman's images (no Docker needed)")
    isub = p.add_subparsers(dest="image_cmd", required=True)

    b = isub.add_parser(
        "build",
        help="build images (layers cached); push them to a loopback registry if one answers",
    )
    b.add_argument("names", nargs="+", choices=IMAGE_NAMES, metavar="NAME")
    b.add_argument("--version", default=None, help=VERSION_HELP)
    b.add_argument(
        "--registry",
        default=None,
        help=f"loopback registry to push to (default {DEFAULT_REGISTRY} when it runs); "
        "any other registry: `sandman image push`",
    )
    b.add_argument("--no-push", action="store_true", help="build into the cache only")
    b.set_defaults(func=cmd_build)

    ps = isub.add_parser(
        "push",
        help="build and push component images to any OCI registry (skopeo: HTTPS, your "
        "docker/podman credentials)",
    )
    ps.add_argument("names", nargs="*", metavar="NAME", help=f"default: {' '.join(COMPONENTS)}")
    ps.add_argument("--registry", required=True, help="REGISTRY[/PREFIX], e.g. ghcr.io/myorg")
    ps.add_argument("--version", default=None, help=VERSION_HELP)
    ps.add_argument(
        "--authfile",
        type=Path,
        default=None,
        help="credentials file (docker config.json or containers auth.json); default: "
        "$XDG_RUNTIME_DIR/containers/auth.json, then ~/.docker/config.json",
    )
    ps.add_argument("--username", default=None, help="with --password-stdin")
    ps.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    ps.add_argument("--ca-file", type=Path, default=None, help="the registry's CA (PEM)")
    ps.add_argument(
        "--insecure",
        action="store_true",
        help="allow plain HTTP or an unverified certificate (loopback registries that speak "
        "plain HTTP are allowed without it)",
    )
    ps.set_defaults(func=cmd_push)

    ex = isub.add_parser(
        "export", help="write component images as docker-archive tarballs (for `kind load`)"
    )
    ex.add_argument("names", nargs="*", metavar="NAME", help=f"default: {' '.join(COMPONENTS)}")
    ex.add_argument("--version", default=None, help=VERSION_HELP)
    ex.add_argument("-o", "--output-dir", type=Path, required=True)
    ex.set_defaults(func=cmd_export)

    r = isub.add_parser("ref", help="print the reference pods should use for an image")
    r.add_argument("name", choices=IMAGE_NAMES, metavar="NAME")
    r.add_argument("--registry", default=DEFAULT_REGISTRY)
    r.add_argument("--version", default=None, help=VERSION_HELP)
    r.set_defaults(func=cmd_ref)

    v = isub.add_parser("version", help="print the version component images get")
    v.add_argument("--version", default=None, help=VERSION_HELP)
    v.set_defaults(func=cmd_version)

    ls = isub.add_parser("list", help="the images Sandman knows how to build")
    ls.set_defaults(func=cmd_list)


def _err(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 1


# What a recipe raises while it computes its layer keys (before ImageBuilder
# wraps errors as ImageBuildError): a failed Go build, a missing package.
RECIPE_ERRORS = (BuildError, ControllerBuildError, DaemonBuildError, PyBaseError)


def _lacking(command: str, names: list[str], version: str | None) -> str | None:
    """What this machine lacks for the command, checked before anything is built."""
    return needs.check(command, names, version or os.environ.get("SANDMAN_VERSION"))


def cmd_build(args: argparse.Namespace) -> int:
    lacking = _lacking("build", args.names, args.version)
    if lacking:
        return _err(lacking)
    builder = ImageBuilder(ClusterConfig().cache_dir)
    target = LoopbackRegistry(args.registry or DEFAULT_REGISTRY)
    push = not args.no_push
    if push and args.registry and not Registry.parse(args.registry).loopback:
        return _err(f"{args.registry} is not a loopback registry: use `sandman image push`")
    if push and not target.ping():
        if args.registry:
            return _err(f"registry {target.host} is not answering")
        print(
            f"note: not pushing: no registry at {target.host} (`sandman cluster up "
            "--real-node` starts one; `sandman image push --registry R` pushes anywhere)",
            file=sys.stderr,
        )
        push = False
    try:
        version = components.resolve_version(args.version, builder.cache_dir)
        for name in args.names:
            t0 = time.monotonic()
            if not push:
                img = builder.build(name, version)
                print(f"{name}: {img.manifest.digest} ({img.size / 1e6:.1f} MB)")
                continue
            built = builder.build_and_push(name, target, version)
            print(
                f"{built.ref}  {built.image.manifest.digest}  {built.image.size / 1e6:.1f} MB "
                f"(uploaded {built.uploaded_bytes / 1e6:.1f} MB, {time.monotonic() - t0:.1f}s)"
            )
    except (ImageBuildError, RegistryError, ImageNameError, *RECIPE_ERRORS) as e:
        return _err(str(e))
    return 0


def _password(args: argparse.Namespace) -> str | None:
    if args.password_stdin:
        if args.username is None:
            raise PushError("--password-stdin needs --username")
        return sys.stdin.readline().rstrip("\n")
    if args.username is not None:
        raise PushError("--username needs --password-stdin (no passwords on the command line)")
    return None


def _names(args: argparse.Namespace) -> list[str]:
    names = args.names or list(COMPONENTS)
    bad = [n for n in names if n not in COMPONENTS]
    if bad:
        raise PushError(f"not a component image: {', '.join(bad)} (known: {', '.join(COMPONENTS)})")
    return names


def cmd_push(args: argparse.Namespace) -> int:
    builder = ImageBuilder(ClusterConfig().cache_dir)
    try:
        lacking = _lacking("push", _names(args), args.version)
        if lacking:
            return _err(lacking)
        opts = PushOptions(
            registry=Registry.parse(args.registry),
            insecure=args.insecure,
            authfile=args.authfile,
            username=args.username,
            password=_password(args),
            ca_file=args.ca_file,
        )
        version = components.resolve_version(args.version, builder.cache_dir)
        for name in _names(args):
            t0 = time.monotonic()
            image = builder.build(name, version)
            ref = push(image, builder.store, opts.registry.ref(name, version), opts, builder.root)
            print(
                f"{ref}  {image.manifest.digest}  {image.size / 1e6:.1f} MB "
                f"({time.monotonic() - t0:.1f}s)"
            )
    except (ImageBuildError, PushError, ImageNameError, *RECIPE_ERRORS) as e:
        return _err(str(e))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    builder = ImageBuilder(ClusterConfig().cache_dir)
    try:
        lacking = _lacking("export", _names(args), args.version)
        if lacking:
            return _err(lacking)
        version = components.resolve_version(args.version, builder.cache_dir)
        for name in _names(args):
            image = builder.build(name, version)
            repo = recipe(name, builder.cache_dir, version).repo
            out = args.output_dir / f"{repo}-{version}.tar"
            export_archive(image, builder.store, repo, version, out, builder.root)
            print(f"{out}  ({repo}:{version}; load with: kind load image-archive {out})")
    except (ImageBuildError, PushError, ImageNameError, *RECIPE_ERRORS) as e:
        return _err(str(e))
    return 0


def cmd_ref(args: argparse.Namespace) -> int:
    print(image_ref(args.name, args.registry, version=args.version))
    return 0


def cmd_version(args: argparse.Namespace) -> int:
    print(components.resolve_version(args.version, ClusterConfig().cache_dir))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    for name in IMAGE_NAMES:
        print(f"{name:<11} {image_ref(name)}")
    return 0
