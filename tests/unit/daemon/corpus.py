"""Run the daemon API's hostile-input corpus (tests/corpus/daemon/*.yaml)
against a daemon: a test process's, or one in a pod.

Every request is written to a socket byte by byte as the case says (so
malformed heads, smuggling attempts and pipelining can be expressed), and
after every case the daemon must still answer ``GET /healthz`` on a new
connection. No case may get a 5xx (unless it says so) and no answer may
carry a traceback. The case format is in tests/corpus/README.md.

Against a pod (the sandbox's token, its IP on the node bridge; the pod's
image needs /bin/sh, ln, mkfifo for the setup steps):

    .venv/bin/python -m tests.unit.daemon.corpus --host 10.244.0.12 \\
        --token "$(sandman token POD)" [--daemon-dir /.sandman] [--json]

Exit status 0 when every case held; the failures are printed.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import io
import json
import os
import re
import socket
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

CORPUS = Path(__file__).resolve().parents[2] / "corpus" / "daemon"
# Generous for a loaded 2-core machine or gVisor; a case that hangs fails.
READ_TIMEOUT_S = 30.0
TRACE_MARKERS = ("Traceback (most recent call last)", 'File "/')


@dataclass
class Target:
    host: str
    port: int
    token: str
    daemon_dir: str = "/.sandman"
    scratch: str = "/tmp/sandman-corpus"
    values: dict[str, str] = field(default_factory=dict)  # saved from responses

    def fill(self, text: str) -> str:
        subs = {
            "scratch": self.scratch,
            "daemon_dir": self.daemon_dir,
            "daemon_parent": os.path.dirname(self.daemon_dir.rstrip("/")) or "/",
            **self.values,
        }
        # {x*N}: the character x, N times (long values without long files);
        # {{ and }} stand for braces, as in str.format.
        text = text.replace("{{", "\0lb\0").replace("}}", "\0rb\0")
        text = re.sub(r"\{(.)\*(\d+)\}", lambda m: m.group(1) * int(m.group(2)), text)
        text = re.sub(r"\{(\w+)\}", lambda m: subs.get(m.group(1), m.group(0)), text)
        return text.replace("\0lb\0", "{").replace("\0rb\0", "}")

    def connect(self) -> socket.socket:
        s = socket.create_connection((self.host, self.port), timeout=READ_TIMEOUT_S)
        s.settimeout(READ_TIMEOUT_S)
        return s


@dataclass
class Response:
    status: int | None  # None: the connection closed without an answer
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


class _Reader:
    def __init__(self, s: socket.socket) -> None:
        self.s = s
        self.buf = b""

    def _more(self) -> bool:
        try:
            data = self.s.recv(1 << 16)
        except (ConnectionResetError, TimeoutError, OSError):
            return False
        self.buf += data
        return bool(data)

    def line(self) -> bytes | None:
        while b"\r\n" not in self.buf:
            if not self._more():
                return None
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def exact(self, n: int) -> bytes | None:
        while len(self.buf) < n:
            if not self._more():
                return None
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def response(self) -> Response:
        status_line = self.line()
        while status_line is not None and status_line.startswith(b"HTTP/1.1 100"):
            self.line()  # the blank line after 100 Continue
            status_line = self.line()
        if not status_line:
            return Response(None, {}, b"")
        status = int(status_line.split(b" ")[1])
        headers: dict[str, str] = {}
        while (line := self.line()) not in (None, b""):
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        if "content-length" in headers:
            body = self.exact(int(headers["content-length"])) or b""
        elif headers.get("transfer-encoding") == "chunked":
            parts = []
            while (size_line := self.line()) is not None:
                size = int(size_line.split(b";")[0], 16)
                if size == 0:
                    self.line()
                    break
                parts.append(self.exact(size) or b"")
                self.line()
            body = b"".join(parts)
        else:
            while self._more():
                pass
            body, self.buf = self.buf, b""
        return Response(status, headers, body)


# -- building requests ----------------------------------------------------------------
def _tar(members: list[dict[str, Any]], gz: bool) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w", format=tarfile.PAX_FORMAT) as t:
        for m in members:
            ti = tarfile.TarInfo(m["name"])
            ti.type = {
                "file": tarfile.REGTYPE,
                "dir": tarfile.DIRTYPE,
                "symlink": tarfile.SYMTYPE,
                "hardlink": tarfile.LNKTYPE,
                "fifo": tarfile.FIFOTYPE,
                "chardev": tarfile.CHRTYPE,
            }[m.get("type", "file")]
            data = m.get("data", "").encode()
            ti.size = len(data) if ti.type == tarfile.REGTYPE else 0
            ti.linkname = m.get("linkname", "")
            mode = m.get("mode", 0o644)
            ti.mode = int(mode, 0) if isinstance(mode, str) else mode  # "0o4755" reads as text
            t.addfile(ti, io.BytesIO(data) if ti.type == tarfile.REGTYPE else None)
    return buf.getvalue()


def _body(req: dict[str, Any], t: Target) -> bytes | None:
    if "json" in req:
        return json.dumps(_fill_obj(req["json"], t)).encode()
    if "body" in req:
        return t.fill(req["body"]).encode("utf-8", "surrogateescape")
    if "body_b64" in req:
        return base64.b64decode(req["body_b64"])
    if "body_repeat" in req:
        r = req["body_repeat"]
        return (
            t.fill(r.get("prefix", "")) + r["text"] * r["times"] + t.fill(r.get("suffix", ""))
        ).encode()
    if "tar" in req:
        return _tar([_fill_obj(m, t) for m in req["tar"]], req.get("gzip", False))
    if "gzip_of_zeros" in req:
        return gzip.compress(bytes(req["gzip_of_zeros"]))
    return None


def _fill_obj(obj: Any, t: Target) -> Any:
    if isinstance(obj, str):
        return t.fill(obj)
    if isinstance(obj, list):
        return [_fill_obj(x, t) for x in obj]
    if isinstance(obj, dict):
        return {k: _fill_obj(v, t) for k, v in obj.items()}
    return obj


def build(req: dict[str, Any], t: Target) -> bytes:
    """The bytes of one request (see README: method, path, query, headers, body...)."""
    if "raw" in req:
        text = t.fill(req["raw"]).replace("{auth}", f"Authorization: Bearer {t.token}")
        return text.encode("utf-8", "surrogateescape")
    target = t.fill(req.get("path", "/"))
    if "query" in req:
        q = "&".join(f"{k}={quote(t.fill(str(v)), safe='/')}" for k, v in req["query"].items())
        target += ("&" if "?" in target else "?") + q
    method = t.fill(req.get("method", "GET"))
    lines = [f"{method} {target} {req.get('version', 'HTTP/1.1')}"]
    headers: list[tuple[str, str]] = [("Host", "sandman")]
    auth = req.get("auth", True)
    if auth is True:
        headers.append(("Authorization", f"Bearer {t.token}"))
    elif isinstance(auth, str):
        headers.append(("Authorization", auth))
    for h in req.get("headers", []):
        name, value = (h[0], h[1]) if isinstance(h, list) else next(iter(h.items()))
        headers.append((name, t.fill(str(value))))
    rep = req.get("headers_repeat")
    if rep:
        headers += [(rep["name"], str(rep["value"]))] * rep["times"]
    body = _body(req, t)
    chunks = req.get("chunks")
    if body is not None and chunks is None and "content_length" not in req:
        headers.append(("Content-Length", str(len(body))))
    if "content_length" in req:
        headers.append(("Content-Length", str(req["content_length"])))
    if chunks is not None:
        headers.append(("Transfer-Encoding", "chunked"))
    head = "\r\n".join(lines + [f"{k}: {v}" for k, v in headers]) + "\r\n\r\n"
    out = head.encode("utf-8", "surrogateescape")
    if chunks is not None:
        data = body or b""
        if chunks == "one":
            out += b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data) if data else b"0\r\n\r\n"
        else:
            out += t.fill(chunks).encode()  # a literal chunked body, malformed on purpose
    elif body is not None:
        out += body
    return out


# -- running --------------------------------------------------------------------------
def send(t: Target, data: bytes, responses: int = 1, half_close: bool = False) -> list[Response]:
    with t.connect() as s:
        try:
            s.sendall(data)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass
        r = _Reader(s)
        return [r.response() for _ in range(responses)]


def _pointer(doc: Any, ptr: str) -> Any:
    for part in ptr.strip("/").split("/") if ptr.strip("/") else []:
        part = part.replace("~1", "/").replace("~0", "~")
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def check(resp: Response, want: dict[str, Any], t: Target) -> list[str]:
    errors = []
    text = resp.body.decode("utf-8", "replace")
    if any(m in text for m in TRACE_MARKERS):
        errors.append(f"a traceback in the answer: {text[:300]!r}")
    st = want.get("status")
    ok_statuses = st if isinstance(st, list) else [st] if st is not None else []
    if resp.status is None:
        return errors if "none" in ok_statuses else [*errors, "no answer (connection closed)"]
    if ok_statuses == ["none"]:
        return [*errors, f"wanted no answer, got {resp.status} {text[:200]!r}"]
    ok_statuses = [s for s in ok_statuses if s != "none"]
    if ok_statuses and not any(
        resp.status == s or (isinstance(s, str) and str(resp.status).startswith(s[0]))
        for s in ok_statuses
    ):
        errors.append(f"status {resp.status}, wanted {st}: {text[:300]!r}")
    if resp.status >= 500 and not want.get("allow_5xx"):
        errors.append(f"a {resp.status}: {text[:300]!r}")
    doc = resp.json()
    if "code" in want:
        got = doc.get("error", {}).get("code") if isinstance(doc, dict) else None
        codes = want["code"] if isinstance(want["code"], list) else [want["code"]]
        if got not in codes:
            errors.append(f"error code {got!r}, wanted {want['code']!r}: {text[:300]!r}")
    for ptr, value in (want.get("json") or {}).items():
        try:
            got = _pointer(doc, ptr)
        except (KeyError, IndexError, TypeError, ValueError):
            got = "<absent>"
        if got != _fill_obj(value, t):
            errors.append(f"{ptr} is {got!r}, wanted {value!r}")
    for needle in want.get("body_contains", []):
        if t.fill(needle) not in text:
            errors.append(f"answer lacks {needle!r}: {text[:300]!r}")
    for needle in want.get("body_lacks", []):
        if t.fill(needle) in text:
            errors.append(f"answer contains {needle!r}")
    for name, value in (want.get("headers") or {}).items():
        if resp.headers.get(name.lower()) != value:
            errors.append(f"header {name} is {resp.headers.get(name.lower())!r}, wanted {value!r}")
    for name, ptr in (want.get("save") or {}).items():
        try:
            t.values[name] = str(_pointer(doc, ptr))
        except (KeyError, IndexError, TypeError, ValueError):
            errors.append(f"cannot save {name} from {ptr}")
    return errors


def healthy(t: Target) -> str | None:
    try:
        (resp,) = send(t, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    except OSError as e:
        return f"/healthz unreachable after the case: {e}"
    if resp.status != 200:
        return f"/healthz answered {resp.status} after the case"
    return None


def _slowloris(case: dict[str, Any], t: Target) -> list[str]:
    """Many connections holding half a request head: others still get answers."""
    socks = []
    try:
        for _ in range(case["connections"]):
            s = t.connect()
            s.sendall(t.fill(case["partial"]).encode())
            socks.append(s)
        problem = healthy(t)
        return [f"while {len(socks)} connections held half a head: {problem}"] if problem else []
    finally:
        for s in socks:
            s.close()


def _cap(case: dict[str, Any], t: Target) -> list[str]:
    """Create until the cap: each within it succeeds, the next is refused."""
    made, errors = [], []
    try:
        for i in range(case["limit"] + 1):
            (resp,) = send(t, build(case["request"], t))
            want = case["over"] if i == case["limit"] else case["each"]
            problems = check(resp, want, t)
            if problems:
                errors += [f"request {i + 1}: {p}" for p in problems]
                break
            doc = resp.json()
            if i < case["limit"] and isinstance(doc, dict) and "id" in doc:
                made.append(doc["id"])
    finally:
        for ident in made:
            path = t.fill(case["cleanup"]).replace("{id}", ident)
            send(t, build({"method": "DELETE", "path": path}, t))
    return errors


def run_case(case: dict[str, Any], t: Target) -> list[str]:
    kind = case.get("kind", "request")
    if kind == "slowloris":
        errors = _slowloris(case, t)
    elif kind == "cap":
        errors = _cap(case, t)
    else:
        reqs = case["requests"] if "requests" in case else [case["request"]]
        errors = []
        if case.get("pipelined"):
            data = b"".join(build(r, t) for r in reqs)
            wants = case["expect"]
            resps = send(t, data, len(wants), case.get("half_close", False))
            for i, (resp, want) in enumerate(zip(resps, wants, strict=True)):
                errors += [f"answer {i + 1}: {e}" for e in check(resp, want, t)]
        else:
            wants = case["expect"] if isinstance(case["expect"], list) else [case["expect"]]
            for req, want in zip(reqs, wants, strict=True):
                (resp,) = send(t, build(req, t), half_close=case.get("half_close", False))
                errors += check(resp, want, t)
    problem = healthy(t)
    return errors + ([problem] if problem else [])


def setup(doc: dict[str, Any], t: Target) -> list[str]:
    errors = []
    for cmd in doc.get("setup", []):
        body = {"cmd": t.fill(cmd), "timeout_s": 60}
        (resp,) = send(t, build({"method": "POST", "path": "/v1/exec", "json": body}, t))
        d = resp.json()
        if resp.status != 200 or not isinstance(d, dict) or d.get("exit_code") != 0:
            errors.append(f"setup {cmd!r} failed: {resp.status} {resp.body[:300]!r}")
    return errors


def load(paths: list[Path] | None = None) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(id, file document, case) of every case, file by file."""
    for path in paths or sorted(CORPUS.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        for case in doc["cases"]:
            yield f"{path.stem}: {case['name']}", doc, case


def run_all(t: Target, paths: list[Path] | None = None) -> dict[str, list[str]]:
    results: dict[str, list[str]] = {}
    done_setup: set[int] = set()
    for ident, doc, case in load(paths):
        if id(doc) not in done_setup:
            done_setup.add(id(doc))
            problems = setup(doc, t)
            if problems:
                results[f"{ident} (setup)"] = problems
        t0 = time.monotonic()
        try:
            results[ident] = run_case(case, t)
        except Exception as e:  # a runner error is a failed case, not a crash
            results[ident] = [f"{type(e).__name__}: {e}"]
        if time.monotonic() - t0 > READ_TIMEOUT_S:
            results[ident].append("took longer than the read timeout")
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, default=7878)
    p.add_argument("--token", required=True)
    p.add_argument("--daemon-dir", default="/.sandman")
    p.add_argument("--scratch", default="/tmp/sandman-corpus")
    p.add_argument("--json", action="store_true", help="one JSON object: case -> problems")
    p.add_argument("files", nargs="*", type=Path)
    a = p.parse_args(argv)
    t = Target(a.host, a.port, a.token, a.daemon_dir, a.scratch)
    results = run_all(t, a.files or None)
    failed = {k: v for k, v in results.items() if v}
    if a.json:
        print(json.dumps(results, indent=1))
    else:
        for k, v in failed.items():
            print(f"FAIL {k}\n  " + "\n  ".join(v))
        print(f"{len(results) - len(failed)} of {len(results)} cases held")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
