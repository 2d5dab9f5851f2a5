"""Build the upstream binaries from the Go module proxy, cached by version.

Each set (kube, etcd, kwok, critools, gvisor) is pinned by a small Go module
under ``hack/`` whose ``tool`` directives (or, for gVisor's shim, a main package
of its own) name the main packages; ``go build`` resolves them through
the module proxy. Output lands in ``<cache>/<set>/<version>/bin/`` and is built
only when a binary is missing. A build goes to a temporary directory and is
renamed into place, so an interrupted build never leaves a half-filled ``bin/``;
a file lock serialises concurrent builders (two terminals, or CI and a dev).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sandman.harness.cluster.config import Versions

REPO_ROOT = Path(__file__).resolve().parents[2]
HACK_DIR = Path(os.environ.get("SANDMAN_HACK_DIR", REPO_ROOT / "hack"))

# The proxy publishes a release's time but not its commit, so the binaries say
# "archive" (upstream's word for builds from a source tarball) instead of
# pretending to know a git hash.
KUBE_BUILD_DATE = {"v1.34.4": "2026-02-10T12:53:36Z"}


# containerd finds a shim by name on its PATH: runtime_type io.containerd.runsc.v1
# -> containerd-shim-runsc-v1.
GVISOR_SHIM = "containerd-shim-runsc-v1"
GVISOR_SHIM_PACKAGE = "sandman.dev/hack/gvisor/cmd/containerd-shim-runsc-v1"
KUBE_ROUTER_VERSION_PKG = "github.com/cloudnativelabs/kube-router/v2/pkg/version"
KUBE_ROUTER_BUILD_DATE = "2024-03-03T05:25:26Z"  # v2.1.0's time on the module proxy


@dataclass(frozen=True)
class BinarySet:
    name: str  # cache folder and hack/ module name
    version: str
    # (main package, binary name) pairs
    outputs: tuple[tuple[str, str], ...]
    ldflags: str = "-s -w"
    tags: str = ""  # go build -tags
    # Only the real node runs it: a kwok-only cluster does not wait for its build.
    node_only: bool = False

    def bin_dir(self, cache_dir: Path, goarch: str | None = None) -> Path:
        """The host's build, or (``goarch``) a cross-compiled one for linux/<goarch>."""
        base = cache_dir / self.name / self.version
        return (base / f"linux-{goarch}" if goarch else base) / "bin"

    @property
    def packages(self) -> tuple[str, ...]:
        return tuple(pkg for pkg, _ in self.outputs)


def _kube_ldflags(version: str) -> str:
    major, minor = version.lstrip("v").split(".")[:2]
    date = KUBE_BUILD_DATE.get(version, "1970-01-01T00:00:00Z")
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=archive",
            f"-X {pkg}.buildDate={date}",
        ]
    return " ".join(flags)


def binary_sets(versions: Versions) -> list[BinarySet]:
    kube = "k8s.io/kubernetes/cmd/"
    return [
        BinarySet(
            "kube",
            versions.kubernetes,
            tuple(
                (kube + c, c)
                for c in (
                    "kube-apiserver",
                    "kube-controller-manager",
                    "kube-scheduler",
                    "kubelet",
                    "kubectl",
                    "kube-proxy",
                )
            ),
            _kube_ldflags(versions.kubernetes),
        ),
        # etcd's main package is the server module itself.
        BinarySet("etcd", versions.etcd, (("go.etcd.io/etcd/server/v3", "etcd"),)),
        BinarySet("kwok", versions.kwok, (("sigs.k8s.io/kwok/cmd/kwok", "kwok"),)),
        BinarySet(
            "critools",
            versions.critools,
            (("sigs.k8s.io/cri-tools/cmd/crictl", "crictl"),),
            f"-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version={versions.critools}",
        ),
        # The real node's second runtime (RuntimeClass gvisor, handler runsc).
        # The shim's main is ours (hack/gvisor/cmd/...: why, in its doc comment).
        BinarySet(
            "gvisor",
            versions.gvisor,
            (
                ("gvisor.dev/gvisor/runsc", "runsc"),
                (GVISOR_SHIM_PACKAGE, GVISOR_SHIM),
            ),
            f"-s -w -X gvisor.dev/gvisor/runsc/version.version={versions.gvisor}",
            node_only=True,
        ),
        # Cluster DNS for the real node's pods. `-version` prints the const
        # CoreVersion; GitCommit is the one ldflag it shows ("archive", as the
        # kube set says). grpcnotrace: upstream's build tag (drops x/net/trace).
        BinarySet(
            "coredns",
            versions.coredns,
            (("github.com/coredns/coredns", "coredns"),),
            "-s -w -X github.com/coredns/coredns/coremain.GitCommit=archive",
            tags="grpcnotrace",
            node_only=True,
        ),
        # NetworkPolicy on the real node (its firewall controller only). Version
        # must be set (it parses it at start); the date is the proxy's release time.
        BinarySet(
            "kube-router",
            versions.kube_router,
            (("github.com/cloudnativelabs/kube-router/v2/cmd/kube-router", "kube-router"),),
            f"-s -w -X {KUBE_ROUTER_VERSION_PKG}.Version={versions.kube_router}"
            f" -X {KUBE_ROUTER_VERSION_PKG}.BuildDate={KUBE_ROUTER_BUILD_DATE}",
            node_only=True,
        ),
    ]


@dataclass(frozen=True)
class Binaries:
    """Resolved paths of every binary the local cluster runs."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubelet: Path
    kubectl: Path
    kwok: Path
    crictl: Path
    kube_proxy: Path
    runsc: Path
    containerd_shim_runsc: Path
    coredns: Path
    kube_router: Path

    # Fields whose binaries only the real node needs (see BinarySet.node_only).
    NODE_ONLY = ("runsc", "containerd_shim_runsc", "coredns", "kube_router")

    @classmethod
    def in_cache(cls, cache_dir: Path, versions: Versions) -> Binaries:
        kube = cache_dir / "kube" / versions.kubernetes / "bin"
        gvisor = cache_dir / "gvisor" / versions.gvisor / "bin"
        return cls(
            etcd=cache_dir / "etcd" / versions.etcd / "bin" / "etcd",
            kube_apiserver=kube / "kube-apiserver",
            kube_controller_manager=kube / "kube-controller-manager",
            kube_scheduler=kube / "kube-scheduler",
            kubelet=kube / "kubelet",
            kubectl=kube / "kubectl",
            kwok=cache_dir / "kwok" / versions.kwok / "bin" / "kwok",
            crictl=cache_dir / "critools" / versions.critools / "bin" / "crictl",
            kube_proxy=kube / "kube-proxy",
            runsc=gvisor / "runsc",
            containerd_shim_runsc=gvisor / GVISOR_SHIM,
            coredns=cache_dir / "coredns" / versions.coredns / "bin" / "coredns",
            kube_router=cache_dir / "kube-router" / versions.kube_router / "bin" / "kube-router",
        )

    def missing(self, *, real_node: bool = True) -> list[Path]:
        return [
            p
            for name, p in vars(self).items()
            if (real_node or name not in self.NODE_ONLY) and not os.access(p, os.X_OK)
        ]


class BuildError(RuntimeError):
    pass


Progress = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _output_name(pkg: str) -> str:
    # `go build -o DIR/` names a binary after the last path element that is not
    # a major-version suffix, so etcd's server/v3 package becomes `server`.
    parts = [p for p in pkg.split("/") if not (p.startswith("v") and p[1:].isdigit())]
    return parts[-1]


def build_set(
    bs: BinarySet, cache_dir: Path, progress: Progress = _stderr, *, goarch: str | None = None
) -> Path:
    """Build one set unless all its binaries are cached; return its bin dir.

    ``goarch`` cross-compiles for linux/<goarch> (images for other nodes) into
    its own bin dir; Go's module and build caches are the same as the host
    build's, so only the packages compiled for the other architecture are new.
    """
    out = bs.bin_dir(cache_dir, goarch)
    wanted = [name for _, name in bs.outputs]
    if all((out / b).exists() for b in wanted):
        return out
    module = HACK_DIR / bs.name
    if not (module / "go.mod").exists():
        raise BuildError(f"{module}/go.mod not found: set SANDMAN_HACK_DIR to the repo's hack/")
    go = shutil.which("go")
    if go is None:
        raise BuildError("`go` not on PATH: the Kubernetes binaries are built from source")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all((out / b).exists() for b in wanted):
            return out  # another builder finished while we waited
        tmp = out.parent / f"bin.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        log = out.parent / "build.log"
        env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=mod")
        if goarch:
            env.update(GOOS="linux", GOARCH=goarch)
        # A set that grew (kube-proxy joined the kube set) builds only what is
        # missing, and the binaries that exist stay in place for running clusters.
        todo = [(pkg, name) for pkg, name in bs.outputs if not (out / name).exists()]
        tags = ["-tags", bs.tags] if bs.tags else []
        cmd = [go, "build", "-trimpath", *tags, "-ldflags", bs.ldflags, "-o", f"{tmp}/"]
        cmd += [pkg for pkg, _ in todo]
        what = f"{bs.name} {bs.version}" + (f" for linux/{goarch}" if goarch else "")
        progress(f"building {what} from the Go module proxy (log: {log})")
        started = time.monotonic()
        with open(log, "w") as logf:
            proc = subprocess.Popen(cmd, cwd=module, env=env, stdout=logf, stderr=subprocess.STDOUT)
            _wait_with_heartbeat(proc, bs.name, started, progress)
        if proc.returncode != 0:
            tail = log.read_text()[-3000:]
            shutil.rmtree(tmp, ignore_errors=True)
            raise BuildError(f"go build of {bs.name} {bs.version} failed:\n{tail}")
        for pkg, name in todo:
            built, final = tmp / _output_name(pkg), tmp / name
            if built != final:
                built.rename(final)
        if out.is_dir():
            for _, name in todo:
                (tmp / name).rename(out / name)
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.rename(out)
        progress(f"built {bs.name} {bs.version} in {time.monotonic() - started:.0f}s -> {out}")
    return out


def _wait_with_heartbeat(
    proc: subprocess.Popen[bytes], name: str, started: float, progress: Progress
) -> None:
    # A cold Kubernetes build takes many minutes; say it is alive every 30 s.
    done = threading.Event()

    def beat() -> None:
        while not done.wait(30):
            progress(f"  ... still building {name} ({time.monotonic() - started:.0f}s)")

    t = threading.Thread(target=beat, daemon=True)
    t.start()
    try:
        proc.wait()
    finally:
        done.set()
        t.join()


def ensure_binaries(
    cache_dir: Path, versions: Versions, progress: Progress = _stderr, *, real_node: bool = True
) -> Binaries:
    """Build (or find cached) every set; the real node's own sets only if ``real_node``."""
    for bs in binary_sets(versions):
        if real_node or not bs.node_only:
            build_set(bs, cache_dir, progress)
    bins = Binaries.in_cache(cache_dir, versions)
    missing = bins.missing(real_node=real_node)
    if missing:
        raise BuildError(f"binaries missing after build: {', '.join(map(str, missing))}")
    return bins
