"""`sandman e2b-gateway` as a user starts it: the namespace is the kubeconfig
context's (as kubectl's), and with `--listen 127.0.0.1:0` it prints the port
the kernel really gave it, which answers. Nothing here needs an apiserver: the
gateway talks to one only when a client asks for a sandbox."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def kubeconfig(path: Path, namespace: str | None) -> Path:
    ns = f", namespace: {namespace}" if namespace else ""
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        'clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]\n'
        f"contexts: [{{name: c, context: {{cluster: c, user: u{ns}}}}}]\n"
        "current-context: c\nusers: [{name: u, user: {token: t}}]\n"
    )
    return path


def start(kc: Path, *extra: str) -> tuple[str, str]:
    """(namespace, url) from the gateway's first lines; then stop it."""
    proc = subprocess.Popen(
        [str(BIN / "sandman"), "e2b-gateway", "--listen", "127.0.0.1:0", *extra],
        stderr=subprocess.PIPE, text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "KUBECONFIG": str(kc),
             "SANDMAN_E2B_API_KEY": "k"},
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        namespace = url = None
        for line in proc.stderr:
            if m := re.match(r"serving E2B's API for namespace (\S+) on (\S+)$", line.strip()):
                namespace = m[1]
            if m := re.match(r"export E2B_API_URL=(\S+) E2B_SANDBOX_URL=(\S+)$", line.strip()):
                url = m[1]
                assert m[2] == url
                break
        assert namespace and url, "no address printed"
        with urllib.request.urlopen(f"{url}/health", timeout=10) as resp:
            assert resp.status < 500  # something of ours listens on the printed port
        return namespace, url
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


def test_port_0_prints_the_port_really_bound(tmp_path: Path) -> None:
    _, url = start(kubeconfig(tmp_path / "kc", "team-a"))
    port = int(url.rsplit(":", 1)[1])
    assert url == f"http://127.0.0.1:{port}" and port != 0


@pytest.mark.parametrize(
    ("context_ns", "flags", "want"),
    [("team-a", (), "team-a"), ("team-a", ("-n", "team-b"), "team-b"), (None, (), "default")],
)
def test_the_namespace_is_the_contexts_unless_given(
    tmp_path: Path, context_ns: str | None, flags: tuple[str, ...], want: str
) -> None:
    namespace, _ = start(kubeconfig(tmp_path / "kc", context_ns), *flags)
    assert namespace == want
