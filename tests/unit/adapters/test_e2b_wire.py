"""E2B's wire shapes and the Connect framing the gateway speaks (pure parts)."""

from __future__ import annotations

import base64
import json
import struct

import pytest

from sandman.adapters.e2b import wire
from sandman.adapters.e2b.connect import (
    END_STREAM,
    ConnectError,
    end_envelope,
    envelope,
    read_envelope,
)
from sandman.adapters.e2b.gateway import GatewayConfig
from sandman.adapters.e2b.processes import process_config


def unpack(frame: bytes) -> tuple[int, dict]:
    flags, length = struct.unpack(">BI", frame[:5])
    assert len(frame) == 5 + length
    return flags, json.loads(frame[5:])


def test_envelopes_round_trip_and_mark_the_end() -> None:
    assert unpack(envelope({"a": 1})) == (0, {"a": 1})
    assert read_envelope(envelope({"path": "/x"})) == {"path": "/x"}
    assert unpack(end_envelope(None)) == (END_STREAM, {})
    flags, end = unpack(end_envelope(ConnectError("not_found", "gone")))
    assert flags == END_STREAM and end == {"error": {"code": "not_found", "message": "gone"}}


@pytest.mark.parametrize(
    "body",
    [b"", b"\x00\x00\x00", envelope({"a": 1}) + envelope({"b": 2}), b"\x01" + envelope({})[1:]],
)
def test_bad_stream_requests_are_refused(body: bytes) -> None:
    with pytest.raises(ConnectError):
        read_envelope(body)


def test_unknown_codes_are_a_programming_error() -> None:
    with pytest.raises(ValueError):
        ConnectError("nope", "x")


@pytest.mark.parametrize(
    ("code", "end"),
    [
        (0, {"exitCode": 0, "exited": True, "status": "exit status 0"}),
        (3, {"exitCode": 3, "exited": True, "status": "exit status 3", "error": "exit status 3"}),
        # a daemon's -9 is SIGKILL: Go's ProcessState says -1, not exited, "signal: killed"
        (-9, {"exitCode": -1, "exited": False, "status": "signal: killed",
              "error": "signal: killed"}),
        (-15, {"exitCode": -1, "exited": False, "status": "signal: terminated",
               "error": "signal: terminated"}),
        (-64, {"exitCode": -1, "exited": False, "status": "signal: signal 64",
               "error": "signal: signal 64"}),
    ],
)  # fmt: skip
def test_end_events_say_what_envd_says(code: int, end: dict) -> None:
    assert wire.end_event(code) == {"event": {"end": end}}


def test_data_events_carry_base64() -> None:
    ev = wire.data_event("stderr", b"\xff\x00oops")
    assert base64.b64decode(ev["event"]["data"]["stderr"]) == b"\xff\x00oops"


def test_entry_info_is_protobuf_json() -> None:
    st = {"name": "a.txt", "path": "/w/a.txt", "type": "file", "size": 10, "mode": "0644",
          "mtime": 0.5, "uid": 0, "gid": 0}  # fmt: skip
    e = wire.entry_info(st)
    assert e == {
        "name": "a.txt",
        "type": "FILE_TYPE_FILE",
        "path": "/w/a.txt",
        "size": "10",  # int64 is a string in protobuf JSON
        "mode": 0o644,
        "permissions": "-rw-r--r--",
        "owner": "0",
        "group": "0",
        "modifiedTime": "1970-01-01T00:00:00.500000Z",
        "isSymlink": False,
    }
    link = wire.entry_info({**st, "type": "symlink", "mode": "0777", "link_target": "/etc"})
    assert (link["permissions"], link["symlinkTarget"], link["isSymlink"]) == (
        "lrwxrwxrwx", "/etc", True)  # fmt: skip
    assert wire.entry_info({**st, "type": "dir", "mode": "0755"})["permissions"] == "drwxr-xr-x"


@pytest.mark.parametrize(
    ("path", "want"),
    [("/tmp/x", "/tmp/x"), ("rel.txt", "/home/user/rel.txt"), ("a/../b", "/home/user/b")],
)
def test_relative_paths_start_at_home(path: str, want: str) -> None:
    assert wire.absolute(path, "/home/user") == want


def test_empty_path_is_refused() -> None:
    with pytest.raises(ConnectError):
        wire.absolute("", "/")


def test_multipart_filenames_keep_their_leading_slash() -> None:
    assert wire.disposition_filename('form-data; name="file"; filename="/tmp/g/m1"') == "/tmp/g/m1"
    assert (
        wire.disposition_filename("form-data; name=\"file\"; filename*=UTF-8''%2Ftmp%2F%C3%A9")
        == "/tmp/é"
    )


@pytest.mark.parametrize(
    ("msg", "want"),
    [({"process": {"pid": 12}}, ("pid", 12)), ({"process": {"tag": "srv"}}, ("tag", "srv"))],
)
def test_selectors(msg: dict, want: tuple) -> None:
    assert wire.selector(msg) == want


def test_bad_selectors_and_signals_are_invalid_arguments() -> None:
    for msg in ({}, {"process": {}}, {"process": {"pid": "x"}}):
        with pytest.raises(ConnectError) as e:
            wire.selector(msg)
        assert e.value.code == "invalid_argument"
    assert wire.signal_name("SIGNAL_SIGKILL") == "KILL" and wire.signal_name(15) == "TERM"
    with pytest.raises(ConnectError):
        wire.signal_name("SIGNAL_SIGSTOP")


def test_process_config_normalises_what_the_sdk_sends() -> None:
    msg = {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "envs": {"A": "1"}}}
    assert process_config(msg) == {
        "cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "envs": {"A": "1"}}  # fmt: skip
    with pytest.raises(ConnectError):
        process_config({"process": {"args": ["x"]}})


def test_templates_map_to_images_or_are_images() -> None:
    cfg = GatewayConfig("ns", "k", templates={"base": "127.0.0.1:5000/sandman/swe:1"})
    assert cfg.image_for("base") == "127.0.0.1:5000/sandman/swe:1"
    assert cfg.image_for("127.0.0.1:5000/x:1") == "127.0.0.1:5000/x:1"
    with pytest.raises(ValueError, match="--template code-interpreter=IMAGE"):
        cfg.image_for("code-interpreter")


def test_sandbox_docs_have_the_fields_e2bs_models_require() -> None:
    from e2b.api.client.models.listed_sandbox import ListedSandbox
    from e2b.api.client.models.sandbox import Sandbox as SandboxModel
    from e2b.api.client.models.sandbox_detail import SandboxDetail

    created = SandboxModel.from_dict(wire.sandbox_doc("sb-1", "base", "tok"))
    assert (created.sandbox_id, created.envd_access_token) == ("sb-1", "tok")
    times = {"started_at": "2026-12-01T00:00:00Z", "end_at": "2026-12-01T00:05:00Z"}
    detail = wire.detail_doc("sb-1", "base", metadata={"k": "v"}, cpu_count=1, memory_mb=512,
                             access_token="tok", **times)  # fmt: skip
    assert SandboxDetail.from_dict(detail).state == "running"
    listed = wire.detail_doc("sb-1", "base", metadata={}, cpu_count=0, memory_mb=0, **times)
    assert ListedSandbox.from_dict(listed).sandbox_id == "sb-1"


@pytest.mark.parametrize("depth", ["x", -1, 65, 1.5, True, [2]])
def test_list_depths_out_of_range_are_invalid_arguments(depth: object) -> None:
    with pytest.raises(ConnectError) as e:
        wire.list_depth({"depth": depth})
    assert e.value.code == "invalid_argument"


def test_list_depths_in_range() -> None:
    assert wire.list_depth({}) == 1 and wire.list_depth({"depth": "3"}) == 3
    assert wire.list_depth({"depth": wire.MAX_LIST_DEPTH}) == wire.MAX_LIST_DEPTH


def test_keepalives_are_at_most_once_a_second() -> None:
    assert wire.keepalive_seconds("50") == 50.0
    assert wire.keepalive_seconds("0.0001") == wire.MIN_KEEPALIVE_S
    for bad in ("", "0", "-5", "nan", "inf", "x"):
        assert wire.keepalive_seconds(bad) is None
