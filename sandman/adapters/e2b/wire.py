"""E2B's wire shapes built from Sandman's (pure: dicts in, dicts out).

envd messages are protobuf JSON (``process.proto``, ``filesystem.proto`` of
envd 0.6.4, as E2B's SDK 2.63.0 ships them): lowerCamelCase names, bytes as
base64, 64-bit integers as strings, enums by name, Timestamps as RFC 3339.
The control plane's documents are E2B's REST models (``Sandbox``,
``SandboxDetail``, ``ListedSandbox``).
"""

from __future__ import annotations

import base64
import datetime as dt
import email.message
import email.utils
import posixpath
import signal
import stat as statmod
from collections.abc import Mapping
from typing import Any

from sandman.adapters.e2b.connect import ConnectError

# The envd version the gateway claims: E2B's SDK turns features on by it
# (e2b/envd/versions.py). 0.6.4 enables what the gateway implements (stdin
# flag, default user, close stdin, octet-stream and gzip uploads); the watch
# features it also enables answer `unimplemented`.
ENVD_VERSION = "0.6.4"
CLIENT_ID = "sandman"

FILE_TYPES = {
    "file": "FILE_TYPE_FILE",
    "dir": "FILE_TYPE_DIRECTORY",
    "symlink": "FILE_TYPE_SYMLINK",
}
# envd sends Go's os.ProcessState.String() as an end event's status: the
# signal names a Go program prints for the signals a command commonly dies of.
GO_SIGNAL_NAMES = {
    signal.SIGHUP: "hangup",
    signal.SIGINT: "interrupt",
    signal.SIGQUIT: "quit",
    signal.SIGABRT: "aborted",
    signal.SIGKILL: "killed",
    signal.SIGSEGV: "segmentation fault",
    signal.SIGPIPE: "broken pipe",
    signal.SIGTERM: "terminated",
}
SIGNALS = {"SIGNAL_SIGKILL": "KILL", "SIGNAL_SIGTERM": "TERM", 9: "KILL", 15: "TERM"}
# ListDir's depth: envd walks at most this deep on request; the walk here is
# one daemon call per directory, so an unbounded depth would let one request
# walk a whole filesystem (and recurse past Python's stack on a deep tree).
MAX_LIST_DEPTH = 64
# A keepalive faster than once a second is no keepalive, just a busy stream
# (the SDK asks for one every 50 s).
MIN_KEEPALIVE_S = 1.0


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def timestamp(t: float) -> str:
    """Seconds since the epoch as a protobuf Timestamp (RFC 3339, UTC)."""
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat().replace("+00:00", "Z")


# -- process events ------------------------------------------------------------------
def start_event(pid: int) -> dict[str, Any]:
    return {"event": {"start": {"pid": pid}}}


def data_event(stream: str, data: bytes) -> dict[str, Any]:
    return {"event": {"data": {stream: b64(data)}}}


def keepalive_event() -> dict[str, Any]:
    return {"event": {"keepalive": {}}}


def end_event(exit_code: int) -> dict[str, Any]:
    """What envd reports for a daemon exit code (``-N``: killed by signal N)."""
    if exit_code >= 0:
        end: dict[str, Any] = {"exitCode": exit_code, "exited": True}
        end["status"] = f"exit status {exit_code}"
    else:
        sig = -exit_code
        try:
            name = GO_SIGNAL_NAMES.get(signal.Signals(sig), f"signal {sig}")
        except ValueError:
            name = f"signal {sig}"
        # Go reports ExitCode() -1 and Exited() false for a signalled process.
        end = {"exitCode": -1, "exited": False, "status": f"signal: {name}"}
    if exit_code != 0:
        end["error"] = end["status"]
    return {"event": {"end": end}}


def process_info(pid: int, cmd: Mapping[str, Any], tag: str | None) -> dict[str, Any]:
    info: dict[str, Any] = {"pid": pid, "config": dict(cmd)}
    if tag:
        info["tag"] = tag
    return info


def selector(msg: Mapping[str, Any]) -> tuple[str, int | str]:
    """("pid", N) or ("tag", T) from a ProcessSelector field named ``process``."""
    sel = msg.get("process") or {}
    if "pid" in sel:
        try:
            return "pid", int(sel["pid"])
        except (TypeError, ValueError):
            raise ConnectError("invalid_argument", f"bad pid {sel['pid']!r}") from None
    if sel.get("tag"):
        return "tag", str(sel["tag"])
    raise ConnectError("invalid_argument", "a process selector needs a pid or a tag")


def list_depth(msg: Mapping[str, Any]) -> int:
    """ListDir's ``depth`` (default 1), from 1 to ``MAX_LIST_DEPTH``."""
    raw = msg.get("depth") or 1
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise ConnectError("invalid_argument", f"bad depth {raw!r}")
    try:
        depth = int(raw)
    except ValueError:
        raise ConnectError("invalid_argument", f"bad depth {raw!r}") from None
    if not 1 <= depth <= MAX_LIST_DEPTH:
        raise ConnectError("invalid_argument", f"depth must be 1 to {MAX_LIST_DEPTH}, got {depth}")
    return depth


def keepalive_seconds(header: str) -> float | None:
    """The ``Keepalive-Ping-Interval`` a client asked for (None: no keepalives),
    at least ``MIN_KEEPALIVE_S``."""
    try:
        value = float(header)
    except ValueError:
        return None
    if not value > 0 or value != value or value == float("inf"):
        return None
    return max(value, MIN_KEEPALIVE_S)


def signal_name(value: Any) -> str:
    if value not in SIGNALS:
        raise ConnectError("invalid_argument", f"unsupported signal {value!r}")
    return SIGNALS[value]


# -- filesystem -----------------------------------------------------------------------
def entry_info(st: Mapping[str, Any]) -> dict[str, Any]:
    """A daemon stat (``/v1/files/stat``) as an EntryInfo."""
    mode = int(str(st.get("mode", "0")), 8)
    kind = {"dir": statmod.S_IFDIR, "symlink": statmod.S_IFLNK}.get(st["type"], statmod.S_IFREG)
    entry: dict[str, Any] = {
        "name": st["name"],
        "type": FILE_TYPES.get(st["type"], "FILE_TYPE_UNSPECIFIED"),
        "path": st["path"],
        "size": str(int(st.get("size", 0))),
        "mode": mode,
        "permissions": statmod.filemode(kind | mode),
        "owner": str(st.get("uid", "")),
        "group": str(st.get("gid", "")),
        "modifiedTime": timestamp(float(st.get("mtime", 0))),
        "isSymlink": st["type"] == "symlink",
    }
    if st.get("link_target"):
        entry["symlinkTarget"] = st["link_target"]
    return entry


def write_info(path: str) -> dict[str, Any]:
    """One element of ``POST /files``'s reply (the REST shape, not protobuf)."""
    return {"name": posixpath.basename(path), "type": "file", "path": path}


def disposition_filename(header: str) -> str:
    """The ``filename`` of a Content-Disposition header, verbatim.

    E2B's SDK sends the target path as the multipart filename; aiohttp's own
    parser drops a leading ``/`` (it sanitises names for saving to disk),
    which would turn ``/tmp/x`` into a path relative to the home directory.
    """
    msg = email.message.Message()
    msg["Content-Disposition"] = header
    name = msg.get_param("filename", header="Content-Disposition")
    if isinstance(name, tuple):  # RFC 2231 encoded: (charset, language, value)
        name = email.utils.collapse_rfc2231_value(name)
    return str(name or "")


def absolute(path: str, home: str) -> str:
    """E2B resolves relative paths against the user's home, as envd does."""
    if not path:
        raise ConnectError("invalid_argument", "empty path")
    return posixpath.normpath(path if path.startswith("/") else posixpath.join(home, path))


# -- control plane -----------------------------------------------------------------------
def sandbox_doc(sandbox_id: str, template: str, access_token: str) -> dict[str, Any]:
    """E2B's ``Sandbox`` (the reply to create and connect)."""
    return {
        "templateID": template,
        "sandboxID": sandbox_id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": access_token,
        "domain": None,
    }


def detail_doc(
    sandbox_id: str,
    template: str,
    *,
    started_at: str,
    end_at: str,
    metadata: Mapping[str, str],
    cpu_count: int,
    memory_mb: int,
    access_token: str | None = None,
) -> dict[str, Any]:
    """E2B's ``SandboxDetail`` / ``ListedSandbox`` (the latter without the token)."""
    doc: dict[str, Any] = {
        "templateID": template,
        "sandboxID": sandbox_id,
        "clientID": CLIENT_ID,
        "startedAt": started_at,
        "endAt": end_at,
        "envdVersion": ENVD_VERSION,
        "cpuCount": cpu_count,
        "memoryMB": memory_mb,
        "diskSizeMB": 0,
        "state": "running",
        "metadata": dict(metadata),
    }
    if access_token is not None:
        doc["envdAccessToken"] = access_token
    return doc
