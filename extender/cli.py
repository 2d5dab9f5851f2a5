"""`sandman extender serve|where` / `python -m sandman.extender serve|where`."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request

from sandman.extender import config as cfg
from sandman.serving import component_main


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("extender", help="the scheduler extender (image-cache-aware placement)")
    esub = p.add_subparsers(dest="extender_cmd", required=True)
    s = esub.add_parser("serve", help="serve /prioritize for kube-scheduler over HTTP")
    cfg.add_flags(s)
    s.set_defaults(func=_serve)
    w = esub.add_parser("where", help="which nodes hold or are pulling IMAGE")
    w.add_argument("image", help="an image reference, e.g. 127.0.0.1:5000/swe/task-17:v1")
    w.add_argument(
        "--url",
        default=f"http://{cfg.DEFAULT_HOST}:{cfg.DEFAULT_PORT}",
        help="the extender's base URL",
    )
    w.add_argument("--json", action="store_true", help="print the raw answer")
    w.set_defaults(func=_where)


def _serve(args: argparse.Namespace) -> int:
    from sandman.extender.server import serve

    return serve(cfg.from_args(args))


def _where(args: argparse.Namespace) -> int:
    url = args.url.rstrip("/") + "/v1/images?" + urllib.parse.urlencode({"image": args.image})
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            doc = json.loads(resp.read())
    except urllib.error.HTTPError as e:
        print(f"extender: {e.code}: {e.read().decode(errors='replace')}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"extender at {args.url} unreachable: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    size = doc["sizeBytes"]
    print(f"{doc['key']}  size {'unknown' if size is None else f'{size / 1e9:.2f} GB'}")
    for h in doc["holders"]:
        print(f"  holds    {h['node']}  ({', '.join(h['evidence'])})")
    for p in doc["pulling"]:
        print(f"  pulling  {p['node']}  ({p['pods']} pods waiting)")
    if not doc["holders"] and not doc["pulling"]:
        print("  no node holds or is pulling it")
    return 0


def main(argv: list[str] | None = None) -> int:
    return component_main("sandman-extender", "extender", add_parser, argv)
