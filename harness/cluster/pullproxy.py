"""Pulls from the local registry at a chosen rate: a throttling proxy on loopback.

The real node pulls from 127.0.0.1:5000 at memory speed, so an image of
hundreds of MB costs a second and warm pools have nothing to hide. A cloud
node pulls at tens to hundreds of MB/s. ``throttled_pulls`` puts a TCP proxy
on a free loopback port in front of the registry and makes it containerd's
first mirror for that registry (``certs.d/<registry>/hosts.toml``, which
containerd reads at every pull), so image references stay
``127.0.0.1:5000/...`` (the policy's allowed registry) while their bytes
come through the proxy. All of the node's connections share one token
bucket: a node has one link. If the proxy dies, containerd falls back to the
registry itself (the next host in the file). On exit the file is restored.

Run as ``python -m sandman.harness.cluster.pullproxy --listen 127.0.0.1:P
--upstream 127.0.0.1:5000 --rate-mb 20``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from sandman.harness.cluster.process import ManagedProcess, wait_until

CHUNK = 64 * 1024  # bytes read per step: 2.5 ms of a 25 MB/s link


class Bucket:
    """Bytes per second shared by every connection (event-loop only)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.free_at = 0.0  # when the link is free again
        self._clock = clock

    def delay(self, nbytes: int) -> float:
        """Seconds to wait before sending ``nbytes`` (books the link for them)."""
        now = self._clock()
        start = max(now, self.free_at)
        self.free_at = start + nbytes / self.rate
        return self.free_at - now


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, bucket: Bucket | None
) -> None:
    try:
        while data := await reader.read(CHUNK):
            if bucket is not None:
                await asyncio.sleep(bucket.delay(len(data)))
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.close()


async def serve(listen: str, upstream: str, rate_bytes: float) -> None:
    bucket = Bucket(rate_bytes)
    up_host, up_port = upstream.rsplit(":", 1)

    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection(up_host, int(up_port))
        except OSError:
            cw.close()
            return
        await asyncio.gather(_pipe(cr, uw, None), _pipe(ur, cw, bucket))

    host, port = listen.rsplit(":", 1)
    server = await asyncio.start_server(handle, host, int(port))
    async with server:
        await server.serve_forever()


def hosts_toml(registry: str, proxy: str) -> str:
    """containerd's hosts file for ``registry``: the proxy first, the registry after."""
    return f"""server = "http://{registry}"

[host."http://{proxy}"]
  capabilities = ["pull", "resolve"]

[host."http://{registry}"]
  capabilities = ["pull", "resolve"]
"""


@contextlib.contextmanager
def throttled_pulls(
    hosts_dir: Path, registry: str, port: int, rate_bytes: float, work_dir: Path
) -> Iterator[ManagedProcess]:
    """While inside, the node's pulls from ``registry`` run at ``rate_bytes``/s."""
    proxy = f"127.0.0.1:{port}"
    proc = ManagedProcess(
        f"pullproxy-{port}",
        (
            sys.executable,
            "-m",
            "sandman.harness.cluster.pullproxy",
            f"--listen={proxy}",
            f"--upstream={registry}",
            f"--rate-bytes={rate_bytes}",
        ),
        work_dir / "run",
        work_dir / "logs",
        stop_timeout_s=5,
    )
    hosts = hosts_dir / registry / "hosts.toml"
    before = hosts.read_text() if hosts.exists() else None
    proc.start()
    try:

        def answers() -> bool:
            with urllib.request.urlopen(f"http://{proxy}/v2/", timeout=2) as r:
                return bool(r.status == 200)

        wait_until(proc, answers, timeout_s=30, what="proxying")
        hosts.parent.mkdir(parents=True, exist_ok=True)
        hosts.write_text(hosts_toml(registry, proxy))
        yield proc
    finally:
        if before is None:
            hosts.unlink(missing_ok=True)
        else:
            hosts.write_text(before)
        proc.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pullproxy", description=__doc__.splitlines()[0])
    p.add_argument("--listen", required=True)
    p.add_argument("--upstream", required=True)
    p.add_argument("--rate-bytes", type=float, required=True, help="bytes/s, all connections")
    args = p.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.listen, args.upstream, args.rate_bytes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
