"""The CLI as a non-admin user sees it, on the control plane (pods on kwok nodes).

A ServiceAccount with only the sandman-user role (bound in its namespace)
claims from a pool with a kubeconfig that names no namespace flag; every
listing speaks `-o json|yaml|name|wide`; names printed by `-o name` are taken
back; what the role does not grant fails with one line naming it; and bash
completion asks the cluster for pod and pool names with the user's kubeconfig.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes.client import CoreV1Api

from sandman.cli.main import COMMANDS
from sandman.harness.cluster.components import KWOK_NODE_ANNOTATION
from sandman.harness.cluster.kwok_nodes import KWOK_IMAGE, NODE_KIND_LABEL
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.testing import wait_for
from tests.kube_users import User, make_user

ON_KWOK = (
    f"--node-selector={NODE_KIND_LABEL}=kwok",
    f"--toleration={KWOK_NODE_ANNOTATION}=fake:NoSchedule",
)
BIN = Path(sys.executable).parent


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    # Run from HOME, not the kubeconfig's directory: its relative paths are its own.
    return subprocess.run(
        [str(BIN / "sandman"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=env["HOME"],
    )


@pytest.fixture
def user(cluster: LocalCluster, core: CoreV1Api, namespace: str, tmp_path: Path) -> User:
    return make_user(cluster, core, namespace, tmp_path / "kube")


def as_user(user: User, tmp: Path) -> dict[str, str]:
    return {
        "PATH": f"{BIN}:/usr/bin:/bin",
        "HOME": str(tmp),
        "KUBECONFIG": str(user.kubeconfig),
        # A loaded test machine can take longer than a shell's 5 s to list.
        "SANDMAN_COMPLETION_TIMEOUT": "60",
    }


def test_a_sandman_user_claims_lists_in_every_format_and_completes(
    cluster: LocalCluster, namespace: str, user: User, tmp_path: Path
) -> None:
    admin = {**as_user(user, tmp_path), "KUBECONFIG": str(cluster.kubeconfig)}
    r = cli(admin, "pool", "create", "web", "-n", namespace, f"--image={KWOK_IMAGE}",
            "--size=2", "--ttl=1h", *ON_KWOK)  # fmt: skip
    assert r.returncode == 0, r.stderr
    env = as_user(user, tmp_path)

    def ready_pool() -> dict[str, object] | None:
        r = cli(env, "pool", "ls", "-o", "json")
        assert r.returncode == 0, r.stderr
        rows = json.loads(r.stdout)
        return rows[0] if rows and rows[0]["ready"] == 2 else None

    row = wait_for(ready_pool, timeout=90, what="pool web: 2 idle pods Ready (seen by the user)")
    assert (row["name"], row["namespace"], row["ttl"]) == ("web", namespace, "1h")
    assert cli(env, "pool", "ls", "-o", "name").stdout == "pool/web\n"
    assert yaml.safe_load(cli(env, "pool", "ls", "-o", "yaml").stdout)[0]["size"] == 2
    wide = cli(env, "pool", "ls", "-o", "wide").stdout.splitlines()
    assert wide[0].split()[:2] == ["NAME", "IMAGE"] and "TTL" in wide[0] and "web" in wide[1]
    assert "TTL" not in cli(env, "pool", "ls").stdout.splitlines()[0]

    # Claim (the role grants pods patch and replicasets get); `pool/NAME` is accepted.
    claimed = cli(env, "claim", "pool/web", "--wait=60", "-o", "name")
    assert claimed.returncode == 0, claimed.stderr
    pod = claimed.stdout.strip().removeprefix("pod/")
    assert claimed.stdout == f"pod/{pod}\n"

    listing = cli(env, "ls", "-o", "json")
    assert listing.returncode == 0, listing.stderr
    rows = {r["name"]: r for r in json.loads(listing.stdout)}
    assert rows[pod]["pool"] == "web" and rows[pod]["claimed_by"]
    names = cli(env, "ls", "-o", "name").stdout.split()
    assert f"pod/{pod}" in names and len(names) == 3  # the claimed one and the refill
    head = cli(env, "ls").stdout.splitlines()[0].split()
    assert head[:2] == ["NAME", "AGE"] and "IMAGE" not in head
    assert "IMAGE" in cli(env, "ls", "-o", "wide").stdout.splitlines()[0]
    assert {r["name"] for r in yaml.safe_load(cli(env, "ls", "-o", "yaml").stdout)} == set(
        n.removeprefix("pod/") for n in names
    )

    # Completion in bash, with the user's kubeconfig: commands, pods, pools.
    def complete(*words: str) -> list[str]:
        script = (
            "source <(sandman completion bash)\n"
            f"COMP_WORDS=(sandman {shlex.join(words)}); COMP_CWORD={len(words)}\n"
            '_sandman_complete; printf "%s\\n" "${COMPREPLY[@]}"\n'
        )
        out = subprocess.run(
            ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    assert complete("po") == sorted(c for c in COMMANDS if c.startswith("po"))
    assert pod in complete("exec", pod[:-2])
    assert complete("claim", "w") == ["web"]
    assert complete("ls", "-o", "") == ["json", "name", "wide", "yaml"]
    # kubectl's own completion of `kubectl sandman ...` runs kubectl_complete-sandman.
    plugin = subprocess.run(
        [str(cluster.binaries.kubectl), "__complete", "sandman", "exec", pod[:-2]],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert plugin.stdout.splitlines()[-1] == ":4" and pod in plugin.stdout.splitlines()

    # What the role does not grant: one line naming the verb, resource and
    # namespace, Sandman's exit code; a permission problem, never a policy denial.
    scale = cli(env, "pool", "scale", "web", "5")
    assert scale.returncode == 125, scale.stderr
    assert scale.stderr.startswith("error: permission denied: "), scale.stderr
    assert "may not patch replicasets.apps in namespace" in scale.stderr, scale.stderr
    assert "sandman-user" in scale.stderr and "polic" not in scale.stderr
    other = cli(env, "ls", "-n", "default")
    assert other.returncode == 125 and "Traceback" not in other.stderr
    assert "may not list pods in namespace default" in other.stderr, other.stderr

    # Names from `-o name` go back in: release the claimed pod as pod/NAME.
    gone = cli(env, "release", f"pod/{pod}")
    assert gone.returncode == 0, gone.stderr
    wait_for(
        lambda: f"pod/{pod}" not in cli(env, "ls", "-o", "name").stdout.split(),
        timeout=60,
        what=f"{pod} released",
    )
