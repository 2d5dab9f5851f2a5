"""`sandman image ...`: build our images without Docker and push them."""

from __future__ import annotations

import argparse
import sys
import time

from sandman.harness.cluster.config import ClusterConfig
from sandman.harness.images.build import (
    DEFAULT_REGISTRY,
    IMAGE_NAMES,
    ImageBuilder,
    ImageBuildError,
    image_ref,
)
from sandman.harness.images.registry import Registry, RegistryError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("image", help="build and push Sandman's images (no Docker needed)")
    isub = p.add_subparsers(dest="image_cmd", required=True)
    b = isub.add_parser("build", help="build images and push them to the local registry")
    b.add_argument("names", nargs="+", choices=IMAGE_NAMES, metavar="NAME")
    b.add_argument("--registry", default=DEFAULT_REGISTRY)
    b.add_argument("--no-push", action="store_true", help="build into the cache only")
    b.set_defaults(func=cmd_build)
    r = isub.add_parser("ref", help="print the reference pods should use for an image")
    r.add_argument("name", choices=IMAGE_NAMES, metavar="NAME")
    r.add_argument("--registry", default=DEFAULT_REGISTRY)
    r.set_defaults(func=cmd_ref)
    ls = isub.add_parser("list", help="the images Sandman knows how to build")
    ls.set_defaults(func=cmd_list)


def cmd_build(args: argparse.Namespace) -> int:
    builder = ImageBuilder(ClusterConfig().cache_dir)
    for name in args.names:
        t0 = time.monotonic()
        try:
            if args.no_push:
                img = builder.build(name)
                print(f"{name}: {img.manifest.digest} ({img.size / 1e6:.1f} MB)")
                continue
            built = builder.build_and_push(name, Registry(args.registry))
        except (ImageBuildError, RegistryError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(
            f"{built.ref}  {built.image.manifest.digest}  {built.image.size / 1e6:.1f} MB "
            f"(uploaded {built.uploaded_bytes / 1e6:.1f} MB, {time.monotonic() - t0:.1f}s)"
        )
    return 0


def cmd_ref(args: argparse.Namespace) -> int:
    print(image_ref(args.name, args.registry))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    for name in IMAGE_NAMES:
        print(f"{name:<8} {image_ref(name)}")
    return 0
