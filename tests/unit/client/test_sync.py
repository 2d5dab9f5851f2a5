"""The synchronous SDK: `from sandman import Sandbox` with no client built first.

A stand-in apiserver (stdlib HTTP on loopback, its own thread) holds the pods;
a stand-in daemon (MockTransport) keeps files in a dict. What is checked: the
process-wide client comes from $KUBECONFIG and the context's namespace, as
the CLI's does; `run`, `files.*` and `kill` block and return plain values;
the context manager kills; errors reach the caller's thread as SandmanErrors.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

import sandman
from sandman.client import (
    DaemonError,
    ExecResult,
    KubernetesError,
    MockResponse,
    MockTransport,
    SandboxStartError,
    SandmanError,
)
from sandman.client import sync as sync_mod
from sandman.client.transport import DaemonRequest, Target
from sandman.tokens import namespace_key

KEY = namespace_key(b"k" * 32, "team-a", "ns-uid")


class FakeApiserver(BaseHTTPRequestHandler):
    pods: dict[str, dict[str, Any]] = {}
    log: list[tuple[str, str]] = []
    refuse: int | None = None

    def _answer(self, status: int, doc: Any) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _route(self) -> None:
        self.log.append((self.command, self.path))
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        if self.refuse:
            return self._answer(self.refuse, {"reason": "Forbidden", "message": "no"})
        parts = self.path.split("?")[0].strip("/").split("/")
        # api v1 namespaces NS pods [NAME]
        ns, name = parts[3], parts[5] if len(parts) > 5 else None
        if self.command == "POST":
            pod = dict(body)
            pod["metadata"] = {
                **pod["metadata"],
                "name": "sandbox-x1",
                "namespace": ns,
                "uid": "u1",
                "labels": {**pod["metadata"]["labels"], "sandman.dev/id": "id1"},
            }
            pod["status"] = {"podIP": "10.0.0.9"}
            self.pods[pod["metadata"]["name"]] = pod
            return self._answer(201, pod)
        if name not in self.pods:
            return self._answer(404, {"reason": "NotFound", "message": f"pods {name!r} not found"})
        if self.command == "DELETE":
            return self._answer(200, self.pods.pop(name))
        return self._answer(200, self.pods[name])

    do_GET = do_POST = do_DELETE = _route

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def apiserver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[type[FakeApiserver]]:
    """A stand-in apiserver, and $KUBECONFIG naming it with namespace team-a."""
    FakeApiserver.pods, FakeApiserver.log, FakeApiserver.refuse = {}, [], None
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeApiserver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}
        ],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [
            {"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}}
        ],
        "current-context": "x",
    }
    (tmp_path / "config").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "config"))
    sync_mod._close_defaults()  # a default client of another test holds another kubeconfig
    yield FakeApiserver
    sync_mod._close_defaults()
    server.shutdown()


class FakeDaemon:
    """Files in a dict; exec answers with its command."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    async def __call__(self, target: Target, req: DaemonRequest) -> MockResponse:
        path = req.params.get("path", "")
        if req.path == "/v1/exec":
            cmd = req.json_body["cmd"]
            return MockResponse.json(
                200, {"exit_code": 3, "stdout": f"ran {cmd} in {req.json_body.get('cwd')}"}
            )
        if req.path == "/v1/files" and req.method == "PUT":
            self.files[path] = req.data  # type: ignore[assignment]
            return MockResponse(204)
        if req.path == "/v1/files":
            if path not in self.files:
                return MockResponse.json(404, {"error": {"code": "not_found", "message": path}})
            return MockResponse(200, self.files[path])
        if req.path == "/v1/files/stat":
            if path not in self.files:
                return MockResponse.json(404, {"error": {"code": "not_found", "message": path}})
            return MockResponse.json(200, {"name": path.rsplit("/", 1)[-1], "type": "file"})
        if req.path == "/v1/files/list":
            names = [p.rsplit("/", 1)[-1] for p in self.files if p.startswith(path + "/")]
            return MockResponse.json(200, {"entries": [{"name": n} for n in names]})
        if req.path == "/v1/files/remove":
            self.files.pop(req.json_body["path"], None)
            return MockResponse.json(200, {})
        return MockResponse.json(404, {"error": {"code": "not_found", "message": req.path}})


def test_create_needs_no_client_and_takes_the_kubeconfigs_namespace(apiserver) -> None:  # type: ignore[no-untyped-def]
    with sandman.Sandbox.create("img:1", ttl="10m", wait=False) as sb:
        assert isinstance(sb, sync_mod.Sandbox)
        assert (sb.namespace, sb.name) == ("team-a", "sandbox-x1")
        assert sb.aio.pod["metadata"]["annotations"]["sandman.dev/ttl"] == "10m"
        again = sandman.Sandbox.connect("sandbox-x1")  # E2B's name for attach
        assert again.client is sb.client  # one process-wide client
    # Leaving the block killed it.
    assert ("DELETE", "/api/v1/namespaces/team-a/pods/sandbox-x1") in apiserver.log
    assert "sandbox-x1" not in apiserver.pods
    sb.kill()  # idempotent


def test_run_and_files_block_and_return_plain_values(apiserver) -> None:  # type: ignore[no-untyped-def]
    daemon = FakeDaemon()
    with sync_mod.connect(transport=MockTransport(daemon), access_keys={"team-a": KEY}) as c:
        sb = sandman.Sandbox.create("img:1", client=c, wait=False)
        r = sb.run("make test", cwd="/w")
        assert isinstance(r, ExecResult)
        assert (r.exit_code, r.stdout) == (3, "ran make test in /w")
        sb.files.write("/w/a.txt", "héllo")
        assert sb.files.read("/w/a.txt") == "héllo"
        assert sb.files.read("/w/a.txt", format="bytes") == "héllo".encode()
        assert [e["name"] for e in sb.files.list("/w")] == ["a.txt"]
        assert sb.files.exists("/w/a.txt") and not sb.files.exists("/w/b.txt")
        sb.files.remove("/w/a.txt")
        assert not sb.files.exists("/w/a.txt")
        # The async SDK's other methods are there, blocking.
        assert sb.exec(["true"]).exit_code == 3
        sb.kill()
    with pytest.raises(SandmanError):
        sb.run("true")  # its client is closed


def test_errors_reach_the_callers_thread_as_sandman_errors(apiserver) -> None:  # type: ignore[no-untyped-def]
    apiserver.refuse = 403
    with pytest.raises(KubernetesError) as e:
        sandman.Sandbox.connect("sandbox-x1")
    assert e.value.status == 403
    with pytest.raises(SandboxStartError):  # a refused create is classified as a start
        sandman.Sandbox.create("img:1", wait=False)
    apiserver.refuse = None
    sb = sandman.Sandbox.create("img:1", wait=False)
    sb.client.client._keys["team-a"] = KEY  # the stand-in has no sandman-access Secret
    # Nobody at 10.0.0.9:7878, so auto goes through the stand-in, which has no pods/proxy.
    with pytest.raises(DaemonError) as d:
        sb.run("true", timeout_s=1)
    assert d.value.status == 404
    sb.kill()


def test_a_forked_child_makes_its_own_default_client(apiserver) -> None:  # type: ignore[no-untyped-def]
    parent = sync_mod.default_client()
    pid = os.fork()
    if pid == 0:  # the child: the parent's loop thread is not here
        signal.alarm(20)  # a call that waits on the parent's loop would wait forever
        ok = sync_mod.default_client() is not parent
        with sandman.Sandbox.create("img:1", wait=False) as sb:
            ok = ok and sb.name == "sandbox-x1"
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert sync_mod.default_client() is parent
