"""`sandman bench controller`: the sandman-controller image, started as a node would.

The image is built (cached), unpacked, and each component (webhook, reaper,
extender) is started from it in a chroot with the image's own interpreter
and files, against a local cluster: time from exec to the first 200 on
/readyz (the webhook's needs its TLS, policy, cluster key and namespace
watch; the reaper's and extender's their watches), and the resident memory
(VmRSS) then. Also the image's size by layer. Needs root (chroot).
With ``--frozen PATH``, the same for an executable that replaces
``/usr/local/bin/sandman`` (a PyInstaller/staticx build, for comparison).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sandman.bench.report import percentile, table
from sandman.contract import NAMESPACE
from sandman.harness.images.build import ImageBuilder
from sandman.harness.images.oci import unpack
from sandman.harness.probes import insecure_context
from sandman.harness.testing import bench_bed, free_port

POLL_S = 0.01
READY_TIMEOUT_S = 60.0


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=3, help="starts per component (median)")
    p.add_argument("--frozen", type=Path, default=None, help="a frozen `sandman` to compare")


def _argv(component: str, port: int) -> list[str]:
    common = [f"--listen=127.0.0.1:{port}", "--kubeconfig=/tmp/kubeconfig"]
    if component == "webhook":
        return [
            "sandman", "webhook", "serve", *common,
            f"--namespace={NAMESPACE}", "--daemon-image=127.0.0.1:5000/sandman-daemon:bench",
            f"--policy-configmap={NAMESPACE}/sandman-policy", "--work-dir=/tmp/webhook",
            "--image-config-lookup=off", "--tls-secret=sandman-webhook-tls-bench",
            "--config-name=sandman-bench",
        ]  # fmt: skip
    if component == "reaper":
        return ["sandman", "reaper", "serve", *common, "--dry-run", "--lease-name=bench-reaper"]
    return ["sandman", "extender", "serve", *common]


def _tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (a frozen binary runs two bootloaders
    before Python)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in (task / "children").read_text().split()]
    return out


def _rss_kib(pid: int) -> int:
    total = 0
    for p in _tree(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def start_once(rootfs: Path, component: str) -> tuple[float, int]:
    port = free_port()
    scheme = "https" if component == "webhook" else "http"
    url = f"{scheme}://127.0.0.1:{port}/readyz"
    env = {"PATH": "/usr/local/bin:/usr/bin", "PYTHONUTF8": "1", "PYTHONDONTWRITEBYTECODE": "1",
           "TMPDIR": "/tmp", "POD_NAMESPACE": NAMESPACE}  # fmt: skip
    # Its log to a file: a pipe nobody reads would block the server's logging.
    with tempfile.TemporaryFile(mode="w+") as log:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [shutil.which("chroot") or "/usr/sbin/chroot", str(rootfs), *_argv(component, port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        try:
            while time.monotonic() - t0 < READY_TIMEOUT_S:
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(
                        f"{component} exited {proc.returncode} before ready:\n{log.read()[-2000:]}"
                    )
                try:
                    with urllib.request.urlopen(url, context=insecure_context(), timeout=1) as r:
                        if r.status == 200:
                            return time.monotonic() - t0, _rss_kib(proc.pid)
                except OSError:
                    pass
                time.sleep(POLL_S)
            raise RuntimeError(f"{component} not ready within {READY_TIMEOUT_S}s")
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


@contextlib.contextmanager
def _proc_mounted(root: Path) -> Iterator[None]:
    (root / "proc").mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "proc", "proc", str(root / "proc")], check=True)
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(root / "proc")], check=False)


def run(args: argparse.Namespace) -> dict[str, Any]:
    if os.geteuid() != 0:
        raise RuntimeError("this benchmark chroots into the image: run it as root")
    bed = bench_bed(need_real_node=False)
    work = Path(tempfile.mkdtemp(prefix="sandman-bench-controller-"))
    try:
        cluster = bed.cluster
        builder = ImageBuilder(cluster.config.cache_dir)
        image = builder.build("controller")
        rootfs = work / "rootfs"
        unpack(image, builder.store, rootfs)
        shutil.copyfile(cluster.kubeconfig, rootfs / "tmp" / "kubeconfig")
        variants = {"python-base": rootfs}
        if args.frozen:
            frozen = work / "frozen"
            shutil.copytree(rootfs, frozen, symlinks=True)
            shutil.copy2(args.frozen, frozen / "usr/local/bin/sandman")
            variants["frozen"] = frozen
        results: dict[str, Any] = {
            "image_bytes": image.size,
            "layers": [layer.blob.size for layer in image.layers],
        }
        rows = [
            ("image (compressed)", f"{image.size / 1e6:.1f} MB"),
            ("layers", ", ".join(f"{layer.blob.size / 1e6:.1f}" for layer in image.layers)),
        ]
        for variant, root in variants.items():
            for component in ("webhook", "reaper", "extender"):
                times, rss = [], []
                for _ in range(args.runs):
                    with _proc_mounted(root):  # as in any container (staticx reads it)
                        t, kib = start_once(root, component)
                    times.append(t)
                    rss.append(kib)
                key = f"{variant}/{component}"
                results[key] = {"ready_s": times, "rss_kib": rss}
                rows.append(
                    (
                        f"{key}: start -> /readyz, RSS",
                        f"p50 {percentile(times, 50):.2f} s (max {max(times):.2f}), "
                        f"{percentile(rss, 50) / 1024:.0f} MiB",
                    )
                )
        print(table("sandman-controller", rows))
        print(json.dumps(results))
        return results
    finally:
        shutil.rmtree(work, ignore_errors=True)
        bed.close()
