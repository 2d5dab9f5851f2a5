"""/v1/exec, auth and error handling against a real `sandmand serve` process."""

from __future__ import annotations

import base64
import concurrent.futures as cf
import json
import os
import socket
from pathlib import Path

import pytest

from sandman.harness.testing import wait_for
from tests.unit.daemon.helpers import Daemon

pytestmark = pytest.mark.daemon_process


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def zombie_children(pid: int) -> list[int]:
    out = []
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                f = Path(f"/proc/{e}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(f[1]) == pid and f[0] == "Z":
                out.append(int(e))
    return out


def test_healthz_is_open_status_needs_the_token(daemon: Daemon) -> None:
    # Every route's side of the auth table: tests/unit/daemon/test_metrics.py.
    assert daemon.request("GET", "/healthz", token="") == (200, {"ok": True})
    status, doc = daemon.request("GET", "/v1/status", token="")
    assert status == 401 and doc["error"]["code"] == "unauthorized"
    status, doc = daemon.request("GET", "/v1/status", token="wrong")
    assert status == 401 and doc["error"]["message"] == "invalid token"
    assert daemon.request("GET", "/v1/status")[0] == 200


def test_exec_argv_shell_cwd_env_stdin(daemon: Daemon, tmp_path: Path) -> None:
    r = daemon.exec(["echo", "a b"])
    assert (r["exit_code"], r["stdout"], r["stderr"]) == (0, "a b\n", "")
    r = daemon.exec("echo $((6*7)); echo oops >&2; exit 3")
    assert (r["exit_code"], r["stdout"], r["stderr"]) == (3, "42\n", "oops\n")
    r = daemon.exec(["pwd"], cwd=str(tmp_path))
    assert r["stdout"] == f"{tmp_path}\n"
    r = daemon.exec("echo $GREETING", env={"GREETING": "hi"})
    assert r["stdout"] == "hi\n"
    r = daemon.exec(["cat"], stdin="from stdin")
    assert r["stdout"] == "from stdin"
    r = daemon.exec(
        ["od", "-An", "-tx1"], stdin=base64.b64encode(b"\x00\xff").decode(), stdin_encoding="base64"
    )
    assert r["stdout"].split() == ["00", "ff"]
    assert r["duration_ms"] > 0 and r["timed_out"] is False


def test_token_never_reaches_commands_and_the_images_env_does(tmp_path: Path) -> None:
    from tests.unit.daemon.helpers import start_daemon, stop_daemon

    # An image's own library and Python paths are its commands' business: they
    # reach them unchanged (the runtime tree ignores them: DT_RPATH and -I;
    # tests/e2e/test_daemon_frozen.py gives the tree PYTHONHOME too, which
    # this test's daemon, the host's Python, would obey).
    image_env = {
        "LD_LIBRARY_PATH": "/opt/image/lib",
        "PYTHONPATH": "/opt/image/py",
        "TMPDIR": "/scratch",
        "KEEP_ME": "yes",
    }
    env = {"SANDMAN_TOKEN_SHA256": "f" * 64, **image_env}
    d = start_daemon(tmp_path, env=env)
    try:
        lines = d.exec(["env"])["stdout"].splitlines()
    finally:
        stop_daemon(d)
    for k, v in image_env.items():
        assert f"{k}={v}" in lines, (k, lines)
    assert not [ln for ln in lines if ln.startswith("SANDMAN_TOKEN")]


def test_old_webhooks_tmpdir_in_the_daemon_dir_is_handed_back() -> None:
    from sandman.daemon.commands import base_environment

    old = {"TMPDIR": "/.sandman", "SANDMAN_TMPDIR_ORIG": "/scratch", "A": "1"}
    assert base_environment(old) == {"TMPDIR": "/scratch", "A": "1", "PATH": ANY_PATH}
    assert "TMPDIR" not in base_environment({"TMPDIR": "/.sandman/tmp"})
    assert base_environment({"TMPDIR": "/.sandmanx"})["TMPDIR"] == "/.sandmanx"


ANY_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def test_binary_output_is_base64(daemon: Daemon) -> None:
    r = daemon.exec(["printf", "\\377\\376ok"])
    assert r["stdout_encoding"] == "base64"
    assert base64.b64decode(r["stdout"]) == b"\xff\xfeok"


def test_output_cap_reports_truncated(daemon: Daemon) -> None:
    # 100 MB of output: capped, and the daemon still answers promptly.
    r = daemon.exec("head -c 100000000 /dev/zero", max_output_bytes=1000)
    assert r["truncated"] is True and r["exit_code"] == 0
    assert len(r["stdout"]) == 1000
    assert daemon.request("GET", "/healthz")[0] == 200


def test_timeout_kills_the_whole_tree(daemon: Daemon) -> None:
    # The grandchild escapes the process group with setsid: still killed.
    r = daemon.exec("sleep 30 & echo $!; setsid sleep 31 & echo $!; wait", timeout_s=0.5)
    assert r["timed_out"] is True and r["exit_code"] == -9
    pids = [int(p) for p in r["stdout"].split()]
    assert len(pids) == 2
    # SIGKILL was sent before the answer; dying takes the kernel a moment.
    # Bounded well under the sleeps' 30 s: a tree left alive fails.
    wait_for(lambda: not any(alive(p) for p in pids), timeout=10, what="the tree to die")


def test_exit_codes_exact_under_load(daemon: Daemon) -> None:
    # 64 concurrent commands with distinct exit codes: a reaper race would show
    # up as 0 or 255 where another code was expected.
    def one(i: int) -> tuple[int, int]:
        return i % 200, daemon.exec(f"exit {i % 200}")["exit_code"]

    with cf.ThreadPoolExecutor(64) as pool:
        results = list(pool.map(one, range(256)))
    assert all(want == got for want, got in results), [r for r in results if r[0] != r[1]]


def test_orphans_are_reaped(daemon: Daemon) -> None:
    for _ in range(5):
        daemon.exec("sleep 0.1 & exit 0")
    # Each orphaned sleep is reaped once it exits; then none is left a zombie.
    wait_for(
        lambda: daemon.ok("GET", "/v1/status")["orphans_reaped"] >= 5,
        timeout=20,
        what="5 orphans reaped",
    )
    assert zombie_children(daemon.proc.pid) == []


def test_fork_storm_within_limits(daemon: Daemon) -> None:
    # An unusual duration marks this test's processes among all of the host's.
    r = daemon.exec("for i in $(seq 200); do sleep 29.123 & done; wait", timeout_s=1)
    assert r["timed_out"] is True

    def left() -> list[str]:
        out = []
        for e in os.listdir("/proc"):
            if not e.isdigit():
                continue
            try:
                cmd = Path(f"/proc/{e}/cmdline").read_bytes()
            except OSError:
                continue
            if cmd == b"sleep\x0029.123\x00" and alive(int(e)):
                out.append(e)
        return out

    # All were sent SIGKILL; bounded well under their 29 s: survivors fail.
    wait_for(lambda: not left(), timeout=10, what="the 200 sleeps to die")
    assert daemon.request("GET", "/healthz")[0] == 200


def test_streaming_exec(daemon: Daemon) -> None:
    status, body = daemon.request(
        "POST", "/v1/exec?stream=1", {"cmd": "echo one; echo two >&2; printf '\\377'; exit 4"}
    )
    assert status == 200
    lines = [json.loads(line) for line in body.decode().splitlines()]
    final = lines[-1]
    assert final["type"] == "result" and final["exit_code"] == 4
    chunks = [ln for ln in lines if ln["type"] == "output"]
    out = b"".join(
        base64.b64decode(c["data"]) if c["encoding"] == "base64" else c["data"].encode()
        for c in chunks
        if c["stream"] == "stdout"
    )
    assert out == b"one\n\xff"
    assert "".join(c["data"] for c in chunks if c["stream"] == "stderr") == "two\n"


def test_a_streamed_exec_that_cannot_start_is_a_plain_400(daemon: Daemon) -> None:
    # As without ?stream=1: the error before any 200, so clients (and proxies
    # on the way) see an answer, not a stream cut after its 200.
    for body, code in (
        ({"cmd": ["no-such-command-xyz"]}, "cannot_start"),
        ({"cmd": ["/etc/passwd"]}, "cannot_start"),
        ({"cmd": ["true"], "cwd": "/no/such/dir"}, "bad_cwd"),
    ):
        status, doc = daemon.request("POST", "/v1/exec?stream=1", body)
        assert (status, doc["error"]["code"]) == (400, code), doc
    _, doc = daemon.request("POST", "/v1/exec?stream=1", {"cmd": ["no-such-command-xyz"]})
    assert "No such file" in doc["error"]["message"]
    assert daemon.request("GET", "/healthz")[0] == 200


def test_client_disconnect_mid_stream_kills_command(daemon: Daemon) -> None:
    marker = f"disconnect-{os.getpid()}"
    body = json.dumps({"cmd": f"while :; do echo {marker}; sleep 0.01; done"}).encode()
    s = socket.create_connection(("127.0.0.1", daemon.port))
    s.sendall(
        b"POST /v1/exec?stream=1 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {daemon.token}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    got = b""
    while marker.encode() not in got:
        chunk = s.recv(4096)
        assert chunk, got
        got += chunk
    s.close()

    def cmdline(pid: str) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:  # exited meanwhile
            return b""

    def running() -> bool:
        return any(
            marker.encode() in cmdline(e) and alive(int(e))
            for e in os.listdir("/proc")
            if e.isdigit()
        )

    wait_for(lambda: not running(), timeout=10, what="the command to be killed")
    assert daemon.exec(["true"])["exit_code"] == 0


def test_bad_inputs_get_json_4xx(daemon: Daemon) -> None:
    cases = [
        (dict(raw=b"{not json"), 400, "invalid_json"),
        (dict(body={"cmd": ["true"], "timeot_s": 1}), 400, "bad_request"),
        (dict(body={"cmd": 42}), 400, "bad_request"),
        (dict(body={"cmd": []}), 400, "bad_request"),
        (dict(body={"cmd": ["true"], "timeout_s": "soon"}), 400, "bad_request"),
        (dict(body={"cmd": ["true"], "timeout_s": -1}), 400, "bad_request"),
        (dict(body={"cmd": ["true"], "env": {"A": 1}}), 400, "bad_request"),
        (dict(body={"cmd": ["no-such-command-xyz"]}), 400, "cannot_start"),
        (dict(body={"cmd": ["true"], "cwd": "/no/such/dir"}), 400, "bad_cwd"),
        (dict(body=[1, 2]), 400, "bad_request"),
        (dict(raw=b"x" * (17 << 20)), 413, "too_large"),
    ]
    for kw, status, code in cases:
        got_status, doc = daemon.request("POST", "/v1/exec", **kw)
        assert (got_status, doc["error"]["code"]) == (status, code), (kw.keys(), doc)
    status, doc = daemon.request("GET", "/v1/nope")
    assert status == 404 and "error" in doc
    status, doc = daemon.request("DELETE", "/v1/exec")
    assert status == 405 and "error" in doc
    assert daemon.exec(["true"])["exit_code"] == 0


def test_no_descriptor_leaks_across_commands(daemon: Daemon) -> None:
    # Every command opens three pipes; failed starts and stdin-fed ones too.
    def fds() -> int:
        return len(os.listdir(f"/proc/{daemon.proc.pid}/fd"))

    daemon.exec(["true"])
    before = fds()
    for i in range(30):
        daemon.exec(["true"])
        daemon.exec(["cat"], stdin="x" * i)
        assert daemon.request("POST", "/v1/exec", {"cmd": ["no-such-xyz"]})[0] == 400
        assert daemon.request("POST", "/v1/exec", {"cmd": ["true"], "cwd": "/nope"})[0] == 400
    assert fds() <= before + 2, (before, fds())  # slack: a keep-alive socket, the executor
