"""The pristine record: what "clean" means for a sandbox, and where it is kept.

Taken once, at first use (before the first request), by ``survey``; reset
restores and verifies against it. An agent that could change the record
could make any state "pristine", so:

- the daemon's memory holds the authoritative copy (zlib-compressed JSON);
  a root daemon makes itself non-dumpable (``selfguard``), so a process in
  the sandbox without CAP_SYS_PTRACE cannot read or write that memory
  through ptrace or /proc/1/mem;
- the copy on disk (``pristine.rec`` in the daemon's dir) exists only for a
  restarted daemon. At each reset it is compared with memory: a difference
  is tampering, reported as drift (and the file is rewritten from memory). It
  carries an HMAC keyed by a key derived from the token hash, so a restarted
  daemon notices a record that was edited or damaged (every reset then
  reports that the record cannot be trusted). The key is not a secret from a
  determined agent (the token hash is in the daemon's environment, which the
  same user can read) and a deleted record cannot be told from a first start:
  a sandbox whose container restarted must not be reused (daemon/API.md).

What this cannot stop is documented in daemon/API.md ("Trust boundary").
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandman.daemon.snapshot import Entry

log = logging.getLogger("sandmand")

RECORD_FILE = "pristine.rec"
FORMAT = 2
MAGIC = b"SANDMAN-PRISTINE %d " % FORMAT
MAC_CONTEXT = b"sandman pristine record"
# zlib level 1: a 13k-entry record compresses ~5x in ~30 ms (level 6: ~6x in
# ~130 ms), and it is compressed at start-up and after deferred hashing.
ZLEVEL = 1


@dataclass
class TreeRecord:
    """One tree: the workspace (restored) or a tree that is only verified."""

    name: str  # "workspace", "git", "manifest", "python"
    root: str
    restore: bool
    entries: dict[str, Entry] = field(default_factory=dict)
    note: str | None = None  # why (part of) it is not checked

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "root": self.root,
            "restore": self.restore,
            "entries": {k: list(v) for k, v in self.entries.items()},
            "note": self.note,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> TreeRecord:
        entries = {k: tuple(v) for k, v in doc["entries"].items()}
        return cls(doc["name"], doc["root"], doc["restore"], entries, doc.get("note"))  # type: ignore[arg-type]


@dataclass
class Record:
    recorded_at: float
    workspace: str | None = None
    git_dir: str | None = None
    objects_dir: str | None = None
    hash_name: str = "sha1"
    commit: str | None = None
    branch: str | None = None
    trees: list[TreeRecord] = field(default_factory=list)
    saved: dict[str, bytes] = field(default_factory=dict)  # BLAKE2b hex -> content
    notes: list[str] = field(default_factory=list)  # drift a reset must always report
    # [tree root, rel] of files hashed after start-up (finish_deferred)
    deferred: list[list[str]] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        doc = {
            "format": FORMAT,
            "recorded_at": self.recorded_at,
            "workspace": self.workspace,
            "git_dir": self.git_dir,
            "objects_dir": self.objects_dir,
            "hash_name": self.hash_name,
            "commit": self.commit,
            "branch": self.branch,
            "trees": [t.to_json() for t in self.trees],
            "saved": {k: base64.b64encode(v).decode() for k, v in self.saved.items()},
            "notes": self.notes,
            "deferred": self.deferred,
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Record:
        doc = json.loads(data)
        if doc.get("format") != FORMAT:
            raise ValueError(f"pristine record format {doc.get('format')!r}, want {FORMAT}")
        return cls(
            recorded_at=doc["recorded_at"],
            workspace=doc["workspace"],
            git_dir=doc["git_dir"],
            objects_dir=doc["objects_dir"],
            hash_name=doc["hash_name"],
            commit=doc["commit"],
            branch=doc["branch"],
            trees=[TreeRecord.from_json(t) for t in doc["trees"]],
            saved={k: base64.b64decode(v) for k, v in doc["saved"].items()},
            notes=list(doc["notes"]),
            deferred=[list(d) for d in doc["deferred"]],
        )


def record_key(token_sha256: str | None) -> bytes:
    """The HMAC key of the record on disk: from the token hash, which only the
    daemon (and whoever reads the pod spec) knows; random without one (then a
    restarted daemon cannot vouch for its record, and says so)."""
    if not token_sha256:
        return os.urandom(32)
    return hmac.new(bytes.fromhex(token_sha256), MAC_CONTEXT, hashlib.sha256).digest()


class Pristine:
    """The record in memory, and its mirror on disk.

    Not thread-safe; used on the event loop (reset holds the reset lock).
    ``known`` remembers, per tree, fingerprints of files a reset rewrote and
    checked by content, so the next reset need not hash them again.
    """

    def __init__(
        self,
        blob: bytes,
        record: Record,
        *,
        source: str,
        invalid: str | None = None,
    ) -> None:
        self._blob = blob  # zlib(record bytes): the authoritative copy
        self.source = source  # "recorded" (this daemon took it) | "disk" (a restart)
        self.invalid = invalid  # why a restarted daemon cannot trust its record
        self.workspace = record.workspace
        self.commit = record.commit
        self.branch = record.branch
        self.recorded_at = record.recorded_at
        self.has_deferred = bool(record.deferred)
        self.known: dict[str, dict[str, Entry]] = {}
        self.pending: asyncio.Future[None] | None = None  # deferred hashing under way

    def replace(self, record: Record) -> None:
        """The record completed (deferred digests filled in)."""
        self._blob = zlib.compress(record.to_bytes(), ZLEVEL)
        self.has_deferred = bool(record.deferred)

    @classmethod
    def of(cls, record: Record) -> Pristine:
        return cls(zlib.compress(record.to_bytes(), ZLEVEL), record, source="recorded")

    @classmethod
    def untrusted(cls, reason: str) -> Pristine:
        return cls(b"", Record(recorded_at=0.0), source="disk", invalid=reason)

    def record(self) -> Record:
        return Record.from_bytes(zlib.decompress(self._blob))

    def info(self) -> dict[str, Any]:
        return {
            "recorded_at": self.recorded_at,
            "source": self.source,
            "trusted": self.invalid is None,
        }

    # -- the copy on disk --------------------------------------------------------
    def file_bytes(self, key: bytes) -> bytes:
        mac = hmac.new(key, self._blob, hashlib.sha256).hexdigest().encode()
        return MAGIC + mac + b"\n" + self._blob

    def save(self, path: Path, key: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(self.file_bytes(key))
        os.replace(tmp, path)

    def check_disk(self, path: Path, key: bytes) -> str | None:
        """Drift if the disk copy no longer matches memory; the file is then
        rewritten from memory (a restart must not inherit the tampering)."""
        if self.invalid is not None:
            return None
        want = self.file_bytes(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                have = f.read(len(want) + 1)
        except OSError as e:
            have = f"unreadable: {e.strerror}".encode()
        if hmac.compare_digest(have, want):
            return None
        try:
            self.save(path, key)
        except OSError as e:
            log.warning("cannot rewrite the pristine record %s: %s", path, e)
        return (
            f"the pristine record on disk ({path}) was altered or removed since first use "
            "(rewritten from the daemon's memory); something in the sandbox tampered with "
            "the daemon's files"
        )


def load(path: Path, key: bytes) -> Pristine | None:
    """The record a previous run of this daemon left, if any.

    None when there is no file (a first start). A file that fails its HMAC or
    does not parse gives an untrusted Pristine: resets then report drift.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        return Pristine.untrusted(f"the pristine record {path} is unreadable: {e.strerror}")
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    head, _, blob = data.partition(b"\n")
    mac = head[len(MAGIC) :]
    if not head.startswith(MAGIC) or not hmac.compare_digest(
        mac, hmac.new(key, blob, hashlib.sha256).hexdigest().encode()
    ):
        return Pristine.untrusted(
            f"the pristine record {path} does not carry this sandbox's signature "
            "(altered, or written by something else)"
        )
    try:
        record = Record.from_bytes(zlib.decompress(blob))
    except (ValueError, KeyError, TypeError, zlib.error) as e:
        return Pristine.untrusted(f"the pristine record {path} is unreadable: {e}")
    return Pristine(blob, record, source="disk")
