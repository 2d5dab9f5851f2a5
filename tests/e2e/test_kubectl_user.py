"""A trainer with only the sandman-user role drives a sandbox's whole life with the CLI.

The user is a ServiceAccount bound to sandman-user in one namespace; its
kubeconfig (a TokenRequest token in a token file, the CA by a relative path,
the namespace in the context) is all the CLI gets. The CLI runs under
Debian's own python3.11 (3.11.2: the oldest Python we support, whose tarfile
has no extraction filters) from a venv of this checkout, through the
apiserver (`--transport proxy`, as from a laptop), on the real node: run,
exec (with stdin), cp both ways (a tree, a single file renamed, a hostile
symlink refused), a background process with its logs, port-forward to a
server bound to 127.0.0.1 inside the sandbox, extend, release. Then what the
role does not grant is refused: another namespace, other Secrets, pods/exec.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import re
import signal
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from sandman.contract import ANN_EXPIRES_AT, parse_time
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.cluster.node import RealNode
from sandman.harness.kube import raw
from sandman.harness.testing import wait_for
from tests.kube_users import User, make_user

REPO = Path(__file__).resolve().parents[2]
DEBIAN_PYTHON = Path("/usr/bin/python3.11")
VENVS = Path.home() / ".cache" / "sandman" / "cli-venvs"

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="session")
def old_python_cli() -> Path:
    """`sandman` in a venv of Debian's python3.11 with this checkout installed
    (editable: the code under test is the working tree). Built once per set of
    dependencies and checkout (pip fetches them from PyPI the first time), then
    reused. The checkout's path is in the key: an editable install points at
    the tree it was made from, and a venv made from another clone (since
    deleted) has no `sandman` to import."""
    recipe = (REPO / "pyproject.toml").read_bytes() + str(REPO).encode()
    key = hashlib.sha256(recipe).hexdigest()[:12]
    venv = VENVS / f"py311-debian-{key}"
    VENVS.mkdir(parents=True, exist_ok=True)
    with open(VENVS / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be building it
        if not (venv / ".complete").exists():
            subprocess.run([str(DEBIAN_PYTHON), "-m", "venv", "--clear", str(venv)], check=True)
            subprocess.run(
                [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                 "-e", str(REPO)],
                check=True, timeout=900,
            )  # fmt: skip
            (venv / ".complete").write_text("")
    version = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import sys, tarfile; print(sys.version_info[:3], hasattr(tarfile, 'data_filter'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert version == "(3, 11, 2) False", f"not the filterless 3.11.2 this test is about: {version}"
    return venv / "bin" / "sandman"


@pytest.fixture
def other_namespace(core: CoreV1Api, namespace: str) -> Iterator[str]:
    name = f"{namespace[:50]}-other"
    core.create_namespace({"metadata": {"name": name, "labels": {"sandman.dev/test": "true"}}})
    yield name
    try:
        core.delete_namespace(name)
    except ApiException as e:
        if e.status != 404:
            raise


def test_a_sandman_user_runs_a_sandbox_life_with_the_cli_on_the_oldest_python(
    cluster: LocalCluster,
    real_node: RealNode,
    core: CoreV1Api,
    namespace: str,
    other_namespace: str,
    images: dict[str, str],
    old_python_cli: Path,
    tmp_path: Path,
) -> None:
    user = make_user(cluster, core, namespace, tmp_path / "kube")
    work = tmp_path / "work"
    work.mkdir()
    env = {
        "PATH": f"{old_python_cli.parent}:/usr/bin:/bin",
        "HOME": str(work),
        "KUBECONFIG": str(user.kubeconfig),
    }

    def cli(
        *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            [str(old_python_cli), *args],
            input=stdin, capture_output=True, text=True, timeout=180, env=env, cwd=work,
        )  # fmt: skip
        if check:
            assert r.returncode == 0, f"sandman {' '.join(args)}: {r.stderr}"
        return r

    # run, as kubectl's: NAME --image=IMAGE -- COMMAND; no -n, the namespace is
    # the context's; the daemon through the apiserver. A lease in plain seconds.
    run = cli("run", "trainer-1", f"--image={images['tiny']}", "--ttl=1200", "--transport=proxy",
              "-o", "jsonpath={.name} {.namespace}", "--", "sleep", "3600")  # fmt: skip
    assert run.stdout == f"trainer-1 {namespace}", run.stdout
    name = "trainer-1"
    pod = raw(core.read_namespaced_pod(name, namespace, _preload_content=False))
    assert pod["metadata"]["namespace"] == namespace
    tp = "--transport=proxy"

    out = cli("exec", name, tp, "--", "sh", "-c", "echo hi; echo err >&2; exit 3", check=False)
    assert (out.returncode, out.stdout, out.stderr) == (3, "hi\n", "err\n")
    assert cli("exec", "-i", name, tp, "--", "wc", "-c", stdin="12345").stdout.split() == ["5"]

    _copies_both_ways(cli, name, work)
    _background_logs_and_port_forward(cli, env, old_python_cli, name, work)
    _kubectl_habits_and_exit_codes(cli, pod, name)

    # extend: the lease annotation moves (the role's pods patch).
    until = parse_time(cli("extend", name, "30m", tp).stdout.strip())
    pod = raw(core.read_namespaced_pod(name, namespace, _preload_content=False))
    assert parse_time(pod["metadata"]["annotations"][ANN_EXPIRES_AT]) == until
    assert until - dt.datetime.now(dt.UTC) > dt.timedelta(minutes=25)
    assert cli("ls", "-o", "name").stdout.split() == [f"pod/{name}"]
    cli("logs", name)  # the container's own log (pods/log)

    _refused_outside_the_role(cli, cluster, user, other_namespace, name, images["tiny"])

    cli("release", f"pod/{name}", tp)
    by_name = f"metadata.name={name}"
    wait_for(
        lambda: not core.list_namespaced_pod(namespace, field_selector=by_name).items,
        timeout=60,
        what=f"{name} deleted",
    )


def _copies_both_ways(cli: Cli, name: str, work: Path) -> None:
    tp = "--transport=proxy"
    tree = work / "up"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.txt").write_text("alpha\n")
    (tree / "sub" / "b.txt").write_text("beta\n")
    (tree / "sub" / "link").symlink_to("b.txt")
    (work / "one.txt").write_text("single\n")
    # A directory to a new name; a file into an existing directory; a file renamed.
    cli("cp", "up", f"{name}:/tmp/tree", tp)
    cli("cp", "one.txt", f"{name}:/tmp/", tp)
    cli("cp", "one.txt", f"{name}:/tmp/renamed.txt", tp)
    listing = cli("exec", name, tp, "--", "sh", "-c",
                  "cat /tmp/tree/sub/link /tmp/one.txt /tmp/renamed.txt").stdout  # fmt: skip
    assert listing == "beta\nsingle\nsingle\n"
    # And back: into a directory, and to a new name.
    (work / "down").mkdir()
    cli("cp", f"{name}:/tmp/tree", "down/", tp)
    assert (work / "down" / "tree" / "sub" / "b.txt").read_text() == "beta\n"
    assert (work / "down" / "tree" / "sub" / "link").is_symlink()
    cli("cp", f"pod/{name}:/tmp/renamed.txt", "back.txt", tp)
    assert (work / "back.txt").read_text() == "single\n"
    # The sandbox is not trusted: a symlink to /etc/passwd in what comes back is
    # refused before anything is written (the 3.11.2 path: no tarfile filters).
    cli("exec", name, tp, "--", "ln", "-s", "/etc/passwd", "/tmp/tree/sub/passwd")
    bad = cli("cp", f"{name}:/tmp/tree", "hostile", tp, check=False)
    assert bad.returncode == 125, bad.stderr
    assert "refused the archive" in bad.stderr and "nothing written" in bad.stderr
    assert "Traceback" not in bad.stderr and not (work / "hostile").exists()


def _background_logs_and_port_forward(
    cli: Cli, env: dict[str, str], sandman: Path, name: str, work: Path
) -> None:
    tp = "--transport=proxy"
    started = cli("exec", "-d", "--name", "counter", name, tp, "--",
                  "sh", "-c", "for i in 1 2 3; do echo line$i; done; exit 7").stdout  # fmt: skip
    proc_id = started.strip()
    # -f follows until the process ends; by name or by id.
    assert cli("logs", name, "counter", "-f", tp).stdout == "line1\nline2\nline3\n"
    assert cli("logs", name, f"process/{proc_id}", tp).stdout == "line1\nline2\nline3\n"
    # A web server bound to the sandbox's loopback only: reachable through port-forward.
    cli("exec", "-d", "--name", "web", name, tp, "--",
        "httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/www")  # fmt: skip
    rows = {r["name"]: r for r in json.loads(cli("ps", name, "-o", "json", tp).stdout)}
    assert rows["counter"]["status"] == "Exited(7)" and rows["web"]["status"] == "Running"
    assert rows["counter"]["id"] == proc_id
    fwd = subprocess.Popen(
        [str(sandman), "port-forward", name, ":8080"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=work,
    )  # fmt: skip
    body: str | None = None
    try:
        assert fwd.stdout is not None
        line = fwd.stdout.readline()
        m = re.fullmatch(r"Forwarding from 127\.0\.0\.1:(\d+) -> 8080\n", line)
        if m:
            url = f"http://127.0.0.1:{m.group(1)}/index.html"

            def fetch() -> str | None:
                try:
                    with urllib.request.urlopen(url, timeout=10) as resp:
                        return resp.read().decode()
                except OSError:
                    return None  # httpd still starting: the kubelet reports a refused dial

            try:
                body = wait_for(fetch, timeout=30, what="httpd via port-forward")
                second = fetch()  # another connection, its own stream
            except AssertionError:
                body = None
    finally:
        fwd.send_signal(signal.SIGINT)
        _, err = fwd.communicate(timeout=30)
    assert m, f"no 'Forwarding from' line: {line!r}; stderr: {err}"
    assert body is not None, f"nothing through port-forward; its stderr: {err}"
    assert "sandman tiny image" in body and second == body
    assert fwd.returncode == 0, err


def _kubectl_habits_and_exit_codes(cli: Cli, pod: dict[str, Any], name: str) -> None:
    tp = "--transport=proxy"
    # The command's own code passes through; one that is not there is 127, one
    # that cannot run 126; Sandman's own failures 125; a usage error 2.
    assert cli("exec", name, tp, "--", "sh", "-c", "exit 125", check=False).returncode == 125
    missing = cli("exec", name, tp, "--", "no-such-command", check=False)
    assert missing.returncode == 127 and "no-such-command" in missing.stderr, missing.stderr
    cannot = cli("exec", name, tp, "--", "/etc/passwd", check=False)
    assert cannot.returncode == 126 and "Permission denied" in cannot.stderr, cannot.stderr
    gone = cli("exec", "no-such-pod", tp, "--", "true", check=False)
    assert gone.returncode == 125 and "no-such-pod" in gone.stderr, gone.stderr
    assert "Traceback" not in gone.stderr
    usage = cli("exec", "--no-such-flag", name, "--", "true", check=False)
    assert usage.returncode == 2 and "unrecognized arguments" in usage.stderr
    # -it in a pipe: kubectl's warning, and the command runs with our stdin.
    piped = cli("exec", "-it", name, tp, "--", "wc", "-c", stdin="1234", check=False)
    assert (piped.returncode, piped.stdout.split()) == (0, ["4"]), piped.stderr
    assert "Unable to use a TTY" in piped.stderr
    # -c: the sandbox's container is accepted; another is refused by name.
    container = pod["spec"]["containers"][0]["name"]
    assert cli("exec", "-c", container, name, tp, "--", "true").returncode == 0
    other = cli("exec", "-c", "sidecar", name, tp, "--", "true", check=False)
    assert other.returncode == 125 and "no container 'sidecar'" in other.stderr, other.stderr
    # logs --tail: the last lines, of a background process and of the container.
    assert cli("logs", name, "counter", "--tail", "2", tp).stdout == "line2\nline3\n"
    assert cli("logs", name, "counter", "--tail=1", "-f", tp).stdout == "line3\n"
    assert cli("logs", name, "--tail", "5").returncode == 0
    # -o jsonpath on a listing, as kubectl's (the rows are a List's items).
    listing = cli("ls", "-o", 'jsonpath={range .items[*]}{.name}:{.state}{"\\n"}{end}')
    assert listing.stdout == f"{name}:Ready\n", listing.stdout
    # Durations: the same forms for every flag.
    assert cli("exec", name, tp, "--timeout=1m30s", "--", "true").returncode == 0


def _refused_outside_the_role(
    cli: Cli, cluster: LocalCluster, user: User, other: str, name: str, image: str
) -> None:
    def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(cluster.binaries.kubectl), f"--kubeconfig={user.kubeconfig}", *args],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    elsewhere = cli("ls", "-n", other, check=False)
    assert elsewhere.returncode == 125, elsewhere.stderr
    assert elsewhere.stderr.startswith("error: permission denied: "), elsewhere.stderr
    assert f"may not list pods in namespace {other}" in elsewhere.stderr, elsewhere.stderr
    assert user.name in elsewhere.stderr and "Traceback" not in elsewhere.stderr
    # A sandbox where the role grants nothing: RBAC's refusal, never called a
    # policy denial; and a policy denial with its rule, never called RBAC's.
    rbac = cli("run", f"--image={image}", "-n", other, check=False)
    assert rbac.returncode == 125, rbac.stderr
    assert "error: sandbox not created: permission denied: " in rbac.stderr, rbac.stderr
    assert user.name in rbac.stderr, rbac.stderr
    assert f"may not create pods in namespace {other}" in rbac.stderr, rbac.stderr
    assert "polic" not in rbac.stderr.lower(), rbac.stderr
    denied = cli("run", "--image=evil.example.com/x:1", "--transport=proxy", check=False)
    assert denied.returncode == 125, denied.stderr
    assert "error: sandbox not created: denied by policy: " in denied.stderr, denied.stderr
    assert "evil.example.com" in denied.stderr and "permission" not in denied.stderr

    def refused(*args: str) -> bool:
        # kubectl words it "Error from server (Forbidden)" or, for generators
        # like `create deployment`, "... is forbidden: User ...".
        r = kubectl(*args)
        return r.returncode != 0 and "forbidden" in r.stderr.lower()

    assert refused("get", "secret", "sandman-access", "-n", other)
    assert refused("run", "x", "-n", other, "--image=none")
    # In its own namespace: no other Secret, no kubectl exec (the daemon is the way in).
    assert refused("get", "secrets")
    assert refused("exec", name, "--", "true")
    assert refused("create", "deployment", "d", "--image=none")
    # What it may do, as the API server sees it.
    assert kubectl("auth", "can-i", "delete", "pods").stdout.strip() == "yes"
    assert kubectl("auth", "can-i", "get", "secret/sandman-access").stdout.strip() == "yes"
    assert kubectl("auth", "can-i", "update", "nodes").stdout.strip() == "no"
