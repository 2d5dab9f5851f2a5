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
from sandman.harness.images.debs import DebError
from sandman.harness.images.oci import Image, ImageIndex
from sandman.harness.images.platforms import Arch, UnknownArch, parse_arches
from sandman.harness.images.platforms import host as host_arch
from sandman.harness.images.push import PushError, PushOptions, export_archive
from sandman.harness.images.push import push as push_image
from sandman.harness.images.pybase import PyBaseError
from sandman.harness.images.registry import Registry as LoopbackRegistry
from sandman.harness.images.registry import RegistryError
from sandman.install.images import COMPONENTS, ImageNameError, Registry

VERSION_HELP = (
    "the one version that tags every component image (default: the release, "
    f"{components.RELEASE}; `dev`: {components.RELEASE}-dev.<content digest>)"
)
ARCH_HELP = (
    "architectures, comma-separated: amd64, arm64 (default: this machine's). Another "
    "architecture's images come from Debian's packages for it and Go's cross-compiler; "
    "the test images and add-ons are built for this machine's only"
)


def _add_arch(p: argparse.ArgumentParser, extra: str = "") -> None:
    p.add_argument("--arch", default=None, metavar="ARCH[,ARCH]", help=ARCH_HELP + extra)


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
    _add_arch(b, "; several push one index per image (skopeo), so each node pulls its own")
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
    _add_arch(ps, "; several push one index (manifest list) per image, so each node pulls its own")
    ps.set_defaults(func=cmd_push)

    ex = isub.add_parser(
        "export", help="write component images as docker-archive tarballs (for `kind load`)"
    )
    ex.add_argument("names", nargs="*", metavar="NAME", help=f"default: {' '.join(COMPONENTS)}")
    ex.add_argument("--version", default=None, help=VERSION_HELP)
    ex.add_argument("-o", "--output-dir", type=Path, required=True)
    _add_arch(ex, "; several write one tarball per architecture, named REPO-VERSION-ARCH.tar")
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
RECIPE_ERRORS = (BuildError, ControllerBuildError, DaemonBuildError, PyBaseError, DebError)


def _arches(args: argparse.Namespace) -> tuple[Arch, ...]:
    try:
        return parse_arches(args.arch)
    except UnknownArch as e:
        raise ImageBuildError(f"--arch: {e}") from None


def _summary(image: Image | ImageIndex) -> str:
    """Digest and pull size of what was built (an index: per architecture)."""
    if isinstance(image, Image):
        return f"{image.manifest.digest}  {image.size / 1e6:.1f} MB"
    per_arch = ", ".join(
        f"{p['architecture']} {img.manifest.digest[:19]} {img.size / 1e6:.1f} MB"
        for p, img in image.entries
    )
    return f"{image.blob.digest}  (index: {per_arch})"


def _lacking(args: argparse.Namespace, command: str, names: list[str]) -> str | None:
    """What this machine lacks for the command, checked before anything is built."""
    try:
        foreign = any(a != host_arch() for a in parse_arches(args.arch))
    except UnknownArch:
        foreign = False  # said by _arches, in the command's own words
    version = args.version or os.environ.get("SANDMAN_VERSION")
    return needs.check(command, names, version, foreign)


def cmd_build(args: argparse.Namespace) -> int:
    lacking = _lacking(args, "build", args.names)
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
        arches = _arches(args)
        version = components.resolve_version(args.version, builder.cache_dir)
        for name in args.names:
            t0 = time.monotonic()
            if not push:
                for arch in arches:
                    img = builder.build(name, version, arch)
                    print(f"{name} ({arch}): {img.manifest.digest} ({img.size / 1e6:.1f} MB)")
                continue
            if len(arches) > 1:
                # An index: skopeo pushes it with every image it lists.
                index = builder.build_all(name, version, arches)
                r = recipe(name, builder.cache_dir, version, arches[0])
                ref = f"{target.host}/{r.repo}:{r.tag}"
                opts = PushOptions(registry=Registry.parse(target.host))
                push_image(index, builder.store, ref, opts, builder.root)
                print(f"{ref}  {_summary(index)} ({time.monotonic() - t0:.1f}s)")
                continue
            built = builder.build_and_push(name, target, version, arches[0])
            print(
                f"{built.ref}  {built.image.manifest.digest}  {built.image.size / 1e6:.1f} MB "
                f"(uploaded {built.uploaded_bytes / 1e6:.1f} MB, {time.monotonic() - t0:.1f}s)"
            )
    except (ImageBuildError, RegistryError, PushError, ImageNameError, *RECIPE_ERRORS) as e:
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
        lacking = _lacking(args, "push", _names(args))
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
        arches = _arches(args)
        version = components.resolve_version(args.version, builder.cache_dir)
        for name in _names(args):
            t0 = time.monotonic()
            image = builder.build_all(name, version, arches)
            ref = push_image(
                image, builder.store, opts.registry.ref(name, version), opts, builder.root
            )
            print(f"{ref}  {_summary(image)} ({time.monotonic() - t0:.1f}s)")
    except (ImageBuildError, PushError, ImageNameError, *RECIPE_ERRORS) as e:
        return _err(str(e))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    builder = ImageBuilder(ClusterConfig().cache_dir)
    try:
        lacking = _lacking(args, "export", _names(args))
        if lacking:
            return _err(lacking)
        arches = _arches(args)
        version = components.resolve_version(args.version, builder.cache_dir)
        for name in _names(args):
            for arch in arches:
                image = builder.build(name, version, arch)
                repo = recipe(name, builder.cache_dir, version, arch).repo
                # A docker archive holds one platform: one file per architecture.
                suffix = f"-{arch}" if len(arches) > 1 else ""
                out = args.output_dir / f"{repo}-{version}{suffix}.tar"
                export_archive(image, builder.store, repo, version, out, builder.root)
                print(
                    f"{out}  ({repo}:{version}, {arch}; load with: kind load image-archive {out})"
                )
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
