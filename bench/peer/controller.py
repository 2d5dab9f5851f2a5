"""The peer's controller: built from its source, its CRDs installed, run as a host process.

The build is cached by a digest of the source tree (the Go files and module
files), so a second run starts at once. The controller runs with its
extensions (templates, warm pools, claims), its defaults otherwise, and the
cluster's admin kubeconfig, as the peer's README describes for any cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sandman.bench.peer.objects import served_crd
from sandman.kube_async import ApiError, KubeClient, Resource

CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)
BINARY = "agent-sandbox-controller"
MAIN_PACKAGE = "./cmd/agent-sandbox-controller"
# A build on 2 cores takes about two minutes (a first one also downloads modules).
BUILD_TIMEOUT_S = 1800.0
CRD_TIMEOUT_S = 60.0


class PeerError(Exception):
    """The peer cannot be built or run from the given source."""


def default_source(repo_root: Path) -> Path | None:
    """``../shared/peers/agent-sandbox`` beside the checkout, when present."""
    cand = repo_root.parent / "shared" / "peers" / "agent-sandbox"
    return cand if (cand / "go.mod").is_file() else None


def check_source(src: Path) -> None:
    if not (src / "go.mod").is_file() or not (src / MAIN_PACKAGE).is_dir():
        raise PeerError(
            f"--peer-src {src}: not an agent-sandbox source tree (no go.mod and "
            f"{MAIN_PACKAGE}); pass the path of a kubernetes-sigs/agent-sandbox checkout"
        )
    if not (src / "k8s" / "crds").is_dir():
        raise PeerError(f"--peer-src {src}: no k8s/crds/ to install")


def source_digest(src: Path) -> str:
    """A digest of what the build reads: Go sources and module files, by path."""
    h = hashlib.sha256()
    for path in sorted(src.rglob("*")):
        if path.suffix not in (".go", ".mod", ".sum") or not path.is_file():
            continue
        rel = path.relative_to(src).as_posix()
        if rel.startswith(("examples/", "test/", "dev/")) or rel.endswith("_test.go"):
            continue
        h.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def build(src: Path, cache_dir: Path, progress: Any = print) -> Path:
    """The controller binary for ``src``, built once per source digest."""
    check_source(src)
    if shutil.which("go") is None:
        raise PeerError("building the peer needs `go` on PATH")
    out = cache_dir / "peers" / f"agent-sandbox-{source_digest(src)}" / BINARY
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    progress(f"building the peer's controller from {src} (about two minutes)")
    tmp = out.with_suffix(".tmp")
    proc = subprocess.run(
        ["go", "build", "-o", str(tmp), MAIN_PACKAGE],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise PeerError(f"go build of the peer failed:\n{tail}")
    tmp.replace(out)
    return out


def crd_documents(src: Path) -> list[dict[str, Any]]:
    docs = []
    for path in sorted((src / "k8s" / "crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                docs.append(served_crd(doc))
    if not docs:
        raise PeerError(f"no CustomResourceDefinition in {src / 'k8s' / 'crds'}")
    return docs


async def install_crds(kube: KubeClient, src: Path) -> list[str]:
    """Create (or replace) the peer's CRDs and wait until each is Established."""
    names = []
    for doc in crd_documents(src):
        name = doc["metadata"]["name"]
        names.append(name)
        try:
            await kube.create(CRDS, doc)
        except ApiError as e:
            if e.status != 409:
                raise
            cur = await kube.get(CRDS, name)
            doc["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
            await kube.replace(CRDS, name, doc)
    deadline = time.monotonic() + CRD_TIMEOUT_S
    for name in names:
        while True:
            crd = await kube.get(CRDS, name)
            conds = (crd.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Established" and c["status"] == "True" for c in conds):
                break
            if time.monotonic() > deadline:
                raise PeerError(f"CRD {name} not Established in {CRD_TIMEOUT_S:.0f}s")
            await asyncio.sleep(0.2)
    return names


async def remove_crds(kube: KubeClient, names: list[str]) -> None:
    for name in names:
        with contextlib.suppress(ApiError):
            await kube.delete(CRDS, name)


@dataclass
class PeerProcess:
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace").strip().splitlines()[-10:]
            raise PeerError(
                f"the peer's controller exited ({self.proc.returncode}):\n" + "\n".join(tail)
            )


@contextlib.contextmanager
def running(binary: Path, kubeconfig: Path, log: Path) -> Iterator[PeerProcess]:
    """The controller with its extensions, no webhook, no leader election, its
    endpoints on loopback ports of its own choosing."""
    argv = [
        str(binary),
        "--extensions",
        "--enable-webhook=false",
        "--leader-elect=false",
        "--metrics-bind-address=127.0.0.1:0",
        "--health-probe-bind-address=127.0.0.1:0",
    ]
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    peer = PeerProcess(proc, log)
    try:
        time.sleep(1.0)
        peer.check_alive()
        yield peer
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
