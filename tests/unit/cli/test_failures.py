"""Every failure that is not a bug is one line and Sandman's exit code, never a
traceback: the real CLI, run as a user runs it, against a kubeconfig that is
not there, an apiserver that does not answer, and a server that answers HTML
(a login page or proxy where the kubeconfig says an apiserver is).

The HTML server is a hostile peer on loopback, not a stand-in for Kubernetes.
"""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sandman.cli.common import (
    EXIT_CANNOT_RUN,
    EXIT_NOT_FOUND,
    EXIT_SANDMAN,
    explain,
    forbidden_message,
)
from sandman.cli.main import prog_name
from sandman.client import DaemonError, SandboxGone, SandboxStartError, startup
from sandman.kube_async import ApiError, KubeconfigError

BIN = Path(sys.executable).parent

# The commands that talk to the cluster, each as a user would type it.
COMMANDS = [
    ["ls"],
    ["ls", "-o", "json"],
    ["exec", "sb-1", "--", "true"],
    ["run", "busybox", "--", "sleep", "1"],
    ["logs", "sb-1"],
    ["release", "sb-1"],
    ["pool", "ls"],
    ["claim", "p1", "--wait", "0"],
    ["fleet", "run", "busybox", "--api-wait", "5", "--", "true"],
]


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {{server: "{server}"}}
contexts:
- name: c
  context: {{cluster: c, user: u, namespace: team-a}}
current-context: c
users:
- name: u
  user: {{token: not-a-real-token}}
"""
    )
    return path


def sandman(
    *args: str, kubeconfig: Path, verbose: bool = False
) -> subprocess.CompletedProcess[str]:
    flags = ["-v"] if verbose else []
    return subprocess.run(
        [str(BIN / "sandman"), *flags, *args],
        capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "KUBECONFIG": str(kubeconfig)},
    )  # fmt: skip


def one_line(argv: list[str], r: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert "Traceback" not in r.stderr, (argv, r.stderr)
    assert len(lines) == 1, (argv, r.stderr)
    assert r.returncode == EXIT_SANDMAN, (argv, r.returncode, r.stderr)
    return lines[0]


@pytest.fixture(scope="module")
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again once the block ends


@pytest.fixture(scope="module")
def html_server() -> Iterator[str]:
    class LoginPage(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html><body>Please log in</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_PATCH = do_DELETE = do_GET

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), LoginPage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def each_command(kc: Path) -> Iterator[tuple[list[str], str]]:
    """(argv, its one error line) for every command, run a few at a time."""
    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(lambda argv: sandman(*argv, kubeconfig=kc), COMMANDS))
    for argv, r in zip(COMMANDS, runs, strict=True):
        yield argv, one_line(argv, r)


def test_no_kubeconfig(tmp_path: Path) -> None:
    for argv, line in each_command(tmp_path / "nothing"):
        assert f"no kubeconfig file at {tmp_path / 'nothing'}" in line, argv


def test_an_apiserver_that_does_not_answer(tmp_path: Path, closed_port: int) -> None:
    kc = kubeconfig(tmp_path / "kc", f"https://127.0.0.1:{closed_port}")
    for argv, line in each_command(kc):
        assert f"Cannot connect to host 127.0.0.1:{closed_port}" in line, argv


def test_an_answer_that_is_not_json(tmp_path: Path, html_server: str) -> None:
    for argv, line in each_command(kubeconfig(tmp_path / "kc", html_server)):
        assert "answer is not JSON" in line, argv


def test_verbose_adds_the_traceback(tmp_path: Path, closed_port: int) -> None:
    kc = kubeconfig(tmp_path / "kc", f"https://127.0.0.1:{closed_port}")
    r = sandman("ls", kubeconfig=kc, verbose=True)
    assert r.returncode == EXIT_SANDMAN and "Traceback" in r.stderr
    assert r.stderr.rstrip().splitlines()[-1].startswith("error: cannot reach the apiserver")


def test_a_usage_error_is_2_and_not_sandmans_code(tmp_path: Path) -> None:
    r = sandman("exec", "--no-such-flag", "sb-1", "--", "true", kubeconfig=tmp_path / "x")
    assert r.returncode == 2 and "unrecognized arguments" in r.stderr


def test_kubectl_sandman_help_says_kubectl_sandman() -> None:
    r = subprocess.run(
        [str(BIN / "kubectl-sandman"), "--help"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0
    assert r.stdout.startswith("usage: kubectl sandman [-h]"), r.stdout[:200]
    r = subprocess.run(
        [str(BIN / "kubectl-sandman"), "exec", "--help"], capture_output=True, text=True, timeout=60
    )
    assert "usage: kubectl sandman exec" in r.stdout


def test_prog_name() -> None:
    assert prog_name("/usr/local/bin/kubectl-sandman") == "kubectl sandman"
    assert prog_name("kubectl-sandman") == "kubectl sandman"
    assert prog_name("/venv/bin/sandman") == "sandman"
    assert prog_name("__main__.py") == "sandman"


# -- what each failure is called, and its code --------------------------------------------
RBAC = (
    'pods is forbidden: User "system:serviceaccount:team-a:trainer" cannot create resource '
    '"pods" in API group "" in the namespace "team-b"'
)
DENIAL = (
    'admission webhook "policy.sandman.dev" denied the request: image evil.io/x:1 is not '
    "from an allowed registry (allowedRegistries: 127.0.0.1:5000/*)"
)


def test_an_rbac_403_is_a_permission_problem_naming_verb_resource_namespace() -> None:
    msg = forbidden_message(RBAC)
    assert msg.startswith("permission denied: system:serviceaccount:team-a:trainer may not ")
    assert "may not create pods in namespace team-b" in msg and "RBAC" in msg
    assert "polic" not in msg
    code, line = explain(ApiError(403, {"message": RBAC}))  # type: ignore[misc]
    assert (code, line) == (EXIT_SANDMAN, msg)


def test_an_rbac_403_on_create_is_not_called_a_policy_denial() -> None:
    e = startup.admission_error(403, {"message": RBAC})
    assert e.reason == SandboxStartError.FORBIDDEN
    code, line = explain(e)  # type: ignore[misc]
    assert code == EXIT_SANDMAN and "permission denied" in line and "polic" not in line


def test_a_webhook_denial_is_a_denial_with_its_rule() -> None:
    e = SandboxStartError(SandboxStartError.POLICY_DENIED, DENIAL, retryable=False)
    _, line = explain(e)  # type: ignore[misc]
    assert line == (
        "sandbox not created: denied by policy: image evil.io/x:1 is not from an allowed "
        "registry (allowedRegistries: 127.0.0.1:5000/*) (webhook policy.sandman.dev)"
    )
    assert "permission" not in line


def test_cluster_scope_rbac() -> None:
    msg = forbidden_message(
        'nodes is forbidden: User "bob" cannot list resource "nodes" in API group "" '
        "at the cluster scope"
    )
    assert "bob may not list nodes at the cluster scope" in msg


def test_a_command_that_cannot_run_is_126_and_one_not_found_127() -> None:
    missing = DaemonError(400, "cannot_start", "cannot start 'nope': No such file or directory")
    denied = DaemonError(400, "cannot_start", "cannot start '/etc/passwd': Permission denied")
    assert explain(missing) == (EXIT_NOT_FOUND, missing.message)
    assert explain(denied) == (EXIT_CANNOT_RUN, denied.message)
    assert explain(DaemonError(400, "bad_cwd", "cwd '/x' is not a directory"))[0] == 126  # type: ignore[index]
    assert (EXIT_NOT_FOUND, EXIT_CANNOT_RUN) == (127, 126)


def test_sandmans_own_failures_are_125() -> None:
    for e in (
        SandboxGone("no pod team-a/sb-1"),
        KubeconfigError("no kubeconfig file at /x"),
        ApiError(404, {"message": 'pods "sb-1" not found'}),
        ConnectionRefusedError(111, "Connect call failed"),
        TimeoutError(),
    ):
        assert explain(e)[0] == EXIT_SANDMAN  # type: ignore[index]


def test_a_bug_keeps_its_traceback() -> None:
    assert explain(KeyError("x")) is None
    assert explain(AttributeError("y")) is None


def test_a_batch_with_infrastructure_failures_is_not_a_usage_error() -> None:
    from sandman.cli.common import EXIT_USAGE
    from sandman.cli.fleet import batch_exit_code

    assert batch_exit_code({"infra_failures": 0}) == 0
    assert batch_exit_code({"infra_failures": 3}) == 1 != EXIT_USAGE
