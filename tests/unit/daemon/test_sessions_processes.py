"""Persistent shell sessions and background processes."""

from __future__ import annotations

import time

import pytest

from tests.unit.daemon.helpers import Daemon

pytestmark = pytest.mark.daemon_process


def test_session_keeps_cd_and_export(daemon: Daemon, tmp_path: str) -> None:
    s = daemon.ok("POST", "/v1/sessions", {})
    run = f"/v1/sessions/{s['id']}/run"
    r = daemon.ok("POST", run, {"cmd": f"cd {tmp_path} && export FOO=bar && pwd"})
    assert (r["exit_code"], r["stdout"], r["cwd"]) == (0, f"{tmp_path}\n", str(tmp_path))
    r = daemon.ok("POST", run, {"cmd": "echo $FOO; pwd; printf 'no newline'; false"})
    assert r["stdout"] == f"bar\n{tmp_path}\nno newline"
    assert r["exit_code"] == 1
    # A command reading stdin gets its own (or nothing), never the next command.
    r = daemon.ok("POST", run, {"cmd": "cat", "stdin": "fed"})
    assert r["stdout"] == "fed"
    r = daemon.ok("POST", run, {"cmd": "cat; echo after"})
    assert r["stdout"] == "after\n"


def test_session_timeout_keeps_the_shell(daemon: Daemon) -> None:
    s = daemon.ok("POST", "/v1/sessions", {})
    run = f"/v1/sessions/{s['id']}/run"
    daemon.ok("POST", run, {"cmd": "export KEEP=1"})
    r = daemon.ok("POST", run, {"cmd": "sleep 30", "timeout_s": 0.3})
    assert r["timed_out"] is True and r["session_alive"] is True
    r = daemon.ok("POST", run, {"cmd": "echo $KEEP"})
    assert r["stdout"] == "1\n"


def test_session_exit_ends_it(daemon: Daemon) -> None:
    s = daemon.ok("POST", "/v1/sessions", {})
    run = f"/v1/sessions/{s['id']}/run"
    r = daemon.ok("POST", run, {"cmd": "echo bye; exit 7"})
    assert (r["exit_code"], r["stdout"], r["session_alive"]) == (7, "bye\n", False)
    status, doc = daemon.request("POST", run, {"cmd": "true"})
    assert status == 503 and doc["error"]["code"] == "session_ended"
    daemon.ok("DELETE", f"/v1/sessions/{s['id']}")
    assert daemon.request("GET", f"/v1/sessions/{s['id']}")[0] == 404


def test_background_process_survives_calls_and_output_rereads(daemon: Daemon) -> None:
    p = daemon.ok(
        "POST",
        "/v1/processes",
        {"cmd": "for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.1; done", "name": "loop"},
    )
    assert p["running"] is True
    daemon.exec(["true"])  # other calls in between
    done = daemon.ok("POST", f"/v1/processes/{p['id']}/wait", {"timeout_s": 10})
    assert (done["running"], done["exit_code"]) == (False, 0)
    out = daemon.ok("GET", f"/v1/processes/{p['id']}/output?stream=stdout")
    assert out["data"] == "out1\nout2\nout3\n" and out["next_offset"] == 15
    again = daemon.ok("GET", f"/v1/processes/{p['id']}/output?stream=stdout&offset=5")
    # "out1\n" is bytes 0-4: offset 5 starts at the second line.
    assert again["data"] == "out2\nout3\n" and again["offset"] == 5
    err = daemon.ok("GET", f"/v1/processes/{p['id']}/output?stream=stderr")
    assert err["data"] == "err1\nerr2\nerr3\n"
    combined = daemon.ok("GET", f"/v1/processes/{p['id']}/output")
    assert sorted(combined["data"].split()) == sorted(
        ["out1", "out2", "out3", "err1", "err2", "err3"]
    )
    listed = daemon.ok("GET", "/v1/processes")["processes"]
    assert [x["id"] for x in listed] == [p["id"]]


def test_background_stdin_signal_and_follow(daemon: Daemon) -> None:
    p = daemon.ok("POST", "/v1/processes", {"cmd": ["cat"], "stdin": True})
    daemon.ok("POST", f"/v1/processes/{p['id']}/stdin", {"data": "hello\n"})
    out = daemon.ok("GET", f"/v1/processes/{p['id']}/output?wait_s=5")
    assert out["data"] == "hello\n"
    # Long-poll: returns as soon as more output exists past the offset.
    t0 = time.monotonic()
    daemon.ok("POST", f"/v1/processes/{p['id']}/stdin", {"data": "more\n", "eof": True})
    nxt = daemon.ok("GET", f"/v1/processes/{p['id']}/output?offset=6&wait_s=5")
    assert nxt["data"] == "more\n" and time.monotonic() - t0 < 4
    waited = daemon.ok("POST", f"/v1/processes/{p['id']}/wait", {"timeout_s": 5})
    assert waited["exit_code"] == 0

    s = daemon.ok("POST", "/v1/processes", {"cmd": ["sleep", "30"]})
    daemon.ok("POST", f"/v1/processes/{s['id']}/signal", {"signal": "TERM"})
    waited = daemon.ok("POST", f"/v1/processes/{s['id']}/wait", {"timeout_s": 5})
    assert waited["exit_code"] == -15
    status, doc = daemon.request("POST", f"/v1/processes/{s['id']}/signal", {"signal": "KILL"})
    assert status == 409 and doc["error"]["code"] == "not_running"
    status, doc = daemon.request("POST", f"/v1/processes/{s['id']}/signal", {"signal": "NOPE"})
    assert status == 400
    daemon.ok("DELETE", f"/v1/processes/{s['id']}")
    assert daemon.request("GET", f"/v1/processes/{s['id']}")[0] == 404


def test_ring_reports_dropped_output(tmp_path: str) -> None:
    from tests.unit.daemon.helpers import start_daemon, stop_daemon

    d = start_daemon(tmp_path)  # type: ignore[arg-type]
    try:
        p = d.ok("POST", "/v1/processes", {"cmd": "head -c 10000000 /dev/zero"})
        d.ok("POST", f"/v1/processes/{p['id']}/wait", {"timeout_s": 10})
        out = d.ok("GET", f"/v1/processes/{p['id']}/output?stream=stdout&limit=10")
        # The ring keeps the last 4 MiB: the first bytes are gone, and say so.
        assert out["dropped"] == 10_000_000 - (4 << 20)
        assert out["offset"] == out["dropped"] and out["end"] == 10_000_000
    finally:
        stop_daemon(d)


def test_session_errors_name_no_internal_path(daemon: Daemon) -> None:
    # The shell's own messages (command not found, syntax errors) must not
    # show the daemon's directory or the session's random id, and must read
    # the same in every session (seeded replays compare runs byte for byte).
    cmd = "echo ok\nno-such-command-xyz\nif then"
    seen = []
    for _ in range(2):
        s = daemon.ok("POST", "/v1/sessions", {})
        run = f"/v1/sessions/{s['id']}/run"
        daemon.ok("POST", run, {"cmd": "true"})  # a second run: line numbers restart
        r = daemon.ok("POST", run, {"cmd": cmd})
        assert r["stdout"] == "ok\n" and r["exit_code"] != 0
        assert "no-such-command-xyz" in r["stderr"] and "line 2" in r["stderr"], r["stderr"]
        for leak in (str(daemon.root / "d"), "session-", s["id"], "run-"):
            assert leak not in r["stderr"], r["stderr"]
        seen.append(r["stderr"])
        daemon.ok("DELETE", f"/v1/sessions/{s['id']}")
    assert seen[0] == seen[1]


async def test_at_the_cap_the_oldest_finished_record_makes_room() -> None:
    import asyncio

    from sandman.daemon.background import Background, BackgroundProcesses
    from sandman.daemon.children import Child, ChildReaper

    procs = BackgroundProcesses(ChildReaper(), {}, 1024, max_count=3)
    loop = asyncio.get_running_loop()

    def record(pid: str, ended: float | None) -> Background:
        b = Background(pid, None, ("x",), Child(0, loop.create_future()), 0.0, {})
        b.exit_code, b.ended = (None, None) if ended is None else (0, ended)
        procs._procs[pid] = b
        return b

    record("running", None)
    record("late", 20.0)
    record("early", 10.0)
    assert procs._forget_oldest_finished() is True
    assert sorted(procs._procs) == ["late", "running"]
    assert procs._forget_oldest_finished() is True
    assert procs._forget_oldest_finished() is False  # only a running one left
    assert sorted(procs._procs) == ["running"]
