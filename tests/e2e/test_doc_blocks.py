"""The code blocks the docs mark runnable run as written, for a user with only
the sandman-user role.

The marker is an HTML comment on the line right before a fence (GitHub
renders nothing for it):

    <!-- runnable -->
    ```python
    ...
    ```

Options go inside the comment: ``<!-- runnable timeout=300 -->`` gives the
block that many seconds (default ``DEFAULT_TIMEOUT_S``); ``role=edit`` binds
that ClusterRole too, for a block written for an operator (warm pools are
ReplicaSets, which sandman-user does not create). ``python`` blocks run
as a script under this checkout's Python, ``sh``/``bash`` blocks under
``bash -eo pipefail``, each in a fresh temporary directory. Every marked
block of README.md and docs/*.md runs here, in a fresh namespace, as a
ServiceAccount bound to sandman-user there (and nothing else
unless ``role=`` says so) (tests/kube_users.py): its
kubeconfig is ``$KUBECONFIG``, with the namespace in its context, so a block
names no namespace. ``sandman``, ``kubectl`` and ``kubectl-sandman`` are on
``PATH``.

Image names: the docs write the local cluster's registry refs,
``127.0.0.1:5000/sandman/NAME:1``; each is replaced by the ref the test
session pushed for NAME (the same string on the local cluster; another
registry's otherwise). A block that fails fails its test with the block's
FILE:LINE, exit status and output.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes.client import CoreV1Api, RbacAuthorizationV1Api

from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.node import RealNode
from sandman.harness.kube import api_client
from tests.kube_users import make_user

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!--\s*runnable\b(?P<opts>[^>]*?)\s*-->\s*$")
FENCE = re.compile(r"^```(?P<lang>\w+)?\s*$")
LANGS = {"python": "python", "py": "python", "sh": "sh", "bash": "sh", "console": None}
IMAGE_REF = re.compile(r"127\.0\.0\.1:5000/sandman/(?P<name>[a-z0-9-]+):1\b")
DEFAULT_TIMEOUT_S = 240.0
SA = "trainer"


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str  # python | sh
    code: str
    timeout_s: float
    roles: tuple[str, ...] = ()  # ClusterRoles bound besides sandman-user

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def parse_options(opts: str, where: str) -> tuple[float, tuple[str, ...]]:
    """``timeout=SECONDS`` and ``role=CLUSTERROLE`` (repeatable)."""
    timeout, roles = DEFAULT_TIMEOUT_S, []
    for word in opts.split():
        key, _, value = word.partition("=")
        if key == "timeout" and value.replace(".", "", 1).isdigit():
            timeout = float(value)
        elif key == "role" and re.fullmatch(r"[a-z0-9:-]+", value):
            roles.append(value)
        else:
            raise ValueError(
                f"{where}: unknown runnable option {word!r} (timeout=SECONDS, role=NAME)"
            )
    return timeout, tuple(roles)


def extract(path: Path) -> list[Block]:
    """The marked blocks of one Markdown file; ValueError for a marker that is
    not right before a python or shell fence (a marker that would run nothing)."""
    lines = path.read_text().splitlines()
    blocks = []
    for i, line in enumerate(lines):
        m = MARKER.match(line)
        if not m:
            continue
        where = f"{path.relative_to(REPO)}:{i + 1}"
        fence = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
        lang = LANGS.get((fence.group("lang") or "") if fence else "")
        if fence is None or lang is None:
            raise ValueError(f"{where}: a runnable marker must precede a python or sh fence")
        end = next((j for j in range(i + 2, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise ValueError(f"{where}: the block never ends")
        code = "\n".join(lines[i + 2 : end]) + "\n"
        timeout, roles = parse_options(m.group("opts"), where)
        blocks.append(Block(path, i + 2, lang, code, timeout, roles))
    return blocks


ALL = [b for p in DOCS for b in extract(p)]


def test_the_runnable_blocks_are_where_the_docs_promise_them() -> None:
    """The SDK quickstarts and the fleet examples stay marked (a dropped
    marker would quietly stop testing them)."""
    files = {b.path.relative_to(REPO).as_posix() for b in ALL}
    assert {"README.md", "docs/sdk.md", "docs/adapters.md"} <= files, files
    assert any("Fleet(" in b.code for b in ALL if b.path.name == "README.md")
    assert sum("Fleet(" in b.code or "fleet run" in b.code for b in ALL) >= 3
    assert any("from sandman import Sandbox" in b.code for b in ALL)


def substitute(code: str, images: dict[str, str]) -> str:
    def ref(m: re.Match[str]) -> str:
        return images.get(m.group("name"), m.group(0))

    return IMAGE_REF.sub(ref, code)


@pytest.mark.parametrize("block", ALL, ids=[b.where for b in ALL])
def test_block_runs(
    block: Block,
    cluster: LocalCluster,
    real_node: RealNode,
    images: dict[str, str],
    core: CoreV1Api,
    namespace: str,
    tmp_path: Path,
) -> None:
    user = make_user(cluster, core, namespace, tmp_path / "user", sa=SA)
    for role in block.roles:
        RbacAuthorizationV1Api(api_client(cluster.kubeconfig)).create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": f"{SA}-{role}"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": SA, "namespace": namespace}],
            },
        )  # fmt: skip
    work = tmp_path / "work"
    work.mkdir()
    code = substitute(block.code, images)
    script = work / ("block.py" if block.lang == "python" else "block.sh")
    script.write_text(code)
    kubectl_dir = Path(cluster.binaries.kubectl).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "SANDMAN_", "E2B_"))}
    env.update(
        KUBECONFIG=str(user.kubeconfig),
        PATH=os.pathsep.join([str(Path(sys.executable).parent), str(kubectl_dir), env["PATH"]]),
        PYTHONUNBUFFERED="1",
    )
    argv = (
        [sys.executable, str(script)]
        if block.lang == "python"
        else ["bash", "-eo", "pipefail", str(script)]
    )
    try:
        out = subprocess.run(
            argv, cwd=work, env=env, capture_output=True, text=True, timeout=block.timeout_s
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(
            f"{block.where}: still running after {block.timeout_s:.0f}s: {shlex.join(argv)}\n"
            f"--- stdout\n{_text(e.stdout)}\n--- stderr\n{_text(e.stderr)}",
            pytrace=False,
        )
    print(f"{block.where}:\n{out.stdout}{out.stderr}")  # shown with -rP
    if out.returncode != 0:
        pytest.fail(
            f"{block.where}: exit {out.returncode}\n--- block\n{code}"
            f"--- stdout\n{out.stdout[-4000:]}\n--- stderr\n{out.stderr[-4000:]}",
            pytrace=False,
        )


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return (data.decode(errors="replace") if isinstance(data, bytes) else data)[-4000:]
