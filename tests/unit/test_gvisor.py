"""The real node's gVisor wiring (pure parts): containerd's runtime, runsc's
options, the binary set and the RuntimeClass."""

from __future__ import annotations

import tomllib
from pathlib import Path

from sandman.contract import LABEL_NODE_KIND
from sandman.harness.cluster import gvisor
from sandman.harness.cluster import realnode as rn
from sandman.harness.cluster.binaries import (
    GVISOR_SHIM,
    HACK_DIR,
    Binaries,
    _output_name,
    binary_sets,
)
from sandman.harness.cluster.config import RealNodeConfig, Versions

CRI = "io.containerd.grpc.v1.cri"


def _containerd(tmp_path: Path) -> dict:  # type: ignore[type-arg]
    lay = rn.NodeLayout(tmp_path / "node")
    return tomllib.loads(rn.containerd_config(RealNodeConfig(), lay))


def test_containerd_has_a_runsc_runtime_next_to_runc(tmp_path: Path) -> None:
    cfg = _containerd(tmp_path)
    cri = cfg["plugins"][CRI]
    runtimes = cri["containerd"]["runtimes"]
    assert cri["containerd"]["default_runtime_name"] == "runc"  # gVisor only when asked for
    runsc = runtimes[gvisor.HANDLER]
    assert runsc["runtime_type"] == "io.containerd.runsc.v1"
    assert runsc["options"] == {
        "TypeUrl": "io.containerd.runsc.v1.options",
        "ConfigPath": str(tmp_path / "node" / "containerd" / "runsc.toml"),
    }
    # Pod authors cannot pass runsc flags through dev.gvisor.* annotations.
    assert "pod_annotations" not in runsc
    # runsc fails on the pause container's oom_score_adj -998 without it.
    assert cri["restrict_oom_score_adj"] is True


def test_runsc_options_pin_binary_root_and_systrap(tmp_path: Path) -> None:
    doc = tomllib.loads(gvisor.runsc_toml(Path("/c/runsc"), tmp_path / "runsc"))
    assert doc["binary_name"] == "/c/runsc"
    assert doc["root"] == str(tmp_path / "runsc")
    assert doc["runsc_config"] == {"platform": "systrap", "network": "sandbox"}
    assert "log_path" not in doc and "debug" not in doc["runsc_config"]


def test_gvisor_set_builds_runsc_and_our_shim_with_the_version() -> None:
    v = Versions()
    (bs,) = [b for b in binary_sets(v) if b.name == "gvisor"]
    assert bs.version == v.gvisor
    assert dict((name, pkg) for pkg, name in bs.outputs) == {
        "runsc": "gvisor.dev/gvisor/runsc",
        GVISOR_SHIM: "sandman.dev/hack/gvisor/cmd/containerd-shim-runsc-v1",
    }
    # `go build -o dir/` already names them so: no rename needed.
    assert {_output_name(pkg) for pkg, _ in bs.outputs} == {"runsc", GVISOR_SHIM}
    assert f"-X gvisor.dev/gvisor/runsc/version.version={v.gvisor}" in bs.ldflags
    mod = (HACK_DIR / "gvisor" / "go.mod").read_text()
    assert f"gvisor.dev/gvisor {v.gvisor}" in mod
    assert (HACK_DIR / "gvisor" / "cmd" / GVISOR_SHIM / "main.go").exists()


def test_binaries_point_into_the_gvisor_cache(tmp_path: Path) -> None:
    v = Versions()
    bins = Binaries.in_cache(tmp_path, v)
    assert bins.runsc == tmp_path / "gvisor" / v.gvisor / "bin" / "runsc"
    assert bins.containerd_shim_runsc == bins.runsc.parent / GVISOR_SHIM
    assert bins.containerd_shim_runsc in bins.missing()


def test_containerd_finds_the_shim_first_on_path() -> None:
    env = gvisor.containerd_env(Path("/c/gvisor/bin"), {"PATH": "/usr/bin", "HOME": "/h"})
    assert env == {"PATH": "/c/gvisor/bin:/usr/bin", "HOME": "/h"}
    assert gvisor.containerd_env(Path("/g"), {})["PATH"].startswith("/g:/usr/sbin")


def test_runtime_class_targets_the_real_node() -> None:
    rc = gvisor.runtime_class()
    assert (rc["metadata"]["name"], rc["handler"]) == ("gvisor", "runsc")
    assert rc["scheduling"]["nodeSelector"] == {LABEL_NODE_KIND: "real"}
    assert rc["overhead"]["podFixed"] == gvisor.POD_OVERHEAD
