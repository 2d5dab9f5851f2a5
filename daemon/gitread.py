"""Read a git repository's objects natively, running no git.

Why: everything git runs (hooks, ``core.fsmonitor``, filter drivers, the
pager, ``git`` itself and every library it loads through a planted
``/etc/ld.so.preload``) is the agent's to replace in a used sandbox, and
``refs/replace``, ``core.worktree`` or a doctored index make git report a
tree it does not have. So the daemon reads the few things reset needs itself
(``gitindex``: the index at first use, HEAD; here: object contents at reset)
and checks every object it reads against its id (the SHA-1 or SHA-256 of its
content), so a modified object file is caught rather than restored.
Formats: loose objects, pack v2 with idx v2, OFS/REF deltas,
``objects/info/alternates``.

Not thread-safe (one reset uses one ``ObjectStore`` at a time).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
import zlib
from pathlib import Path

from sandman.daemon.gitindex import OID_BYTES, GitReadError, varint

# A blob larger than this is not restored (reset reports it instead): it is
# held in memory whole, with its delta base.
MAX_BLOB_BYTES = 256 << 20
# Resolved delta bases kept per reset (pack offset -> bytes): long delta
# chains in one pack would otherwise be inflated again for every object.
BASE_CACHE_BYTES = 64 << 20
MAX_ALTERNATE_DEPTH = 5  # git's own limit


def blob_id(content: bytes, hash_name: str = "sha1") -> str:
    h = hashlib.new(hash_name)
    h.update(b"blob %d\0" % len(content))
    h.update(content)
    return h.hexdigest()


_TYPES = {1: b"commit", 2: b"tree", 3: b"blob", 4: b"tag"}


class ObjectStore:
    """Blobs by id from loose objects and packs (and alternates), verified."""

    def __init__(self, objects_dir: Path, hash_name: str = "sha1") -> None:
        self.hash_name = hash_name
        self.dirs = _object_dirs(objects_dir)
        self._packs: list[_Pack] | None = None
        self._cache: dict[tuple[int, int], tuple[int, bytes]] = {}
        self._cache_bytes = 0

    def packs(self) -> list[_Pack]:
        if self._packs is None:
            self._packs = []
            for d in self.dirs:
                pack_dir = d / "pack"
                try:
                    names = sorted(os.listdir(pack_dir))
                except OSError:
                    continue
                for n in names:
                    if n.endswith(".idx") and (pack_dir / (n[:-4] + ".pack")).is_file():
                        self._packs.append(
                            _Pack(pack_dir / n, len(self._packs), OID_BYTES[self.hash_name])
                        )
        return self._packs

    def blob(self, oid: str) -> bytes:
        """The blob's content; GitReadError if missing, too big or not matching its id."""
        kind, data = self._object(oid)
        if kind != 3:
            raise GitReadError(f"object {oid} is a {_TYPES.get(kind, b'?').decode()}, not a blob")
        if blob_id(data, self.hash_name) != oid:
            raise GitReadError(f"object {oid} does not hash to its id (the object was altered)")
        return data

    def loose(self, oid: str) -> bytes:
        """The object as a loose object file (zlib of "type size\\0content"),
        wherever it is stored now; checked against its id first."""
        kind, data = self._object(oid)
        name = _TYPES.get(kind)
        if name is None:
            raise GitReadError(f"object {oid} has an unknown type")
        head = b"%s %d\0" % (name, len(data))
        if hashlib.new(self.hash_name, head + data).hexdigest() != oid:
            raise GitReadError(f"object {oid} does not hash to its id (the object was altered)")
        return zlib.compress(head + data)

    def _object(self, oid: str) -> tuple[int, bytes]:
        for d in self.dirs:
            path = d / oid[:2] / oid[2:]
            try:
                raw = path.read_bytes()
            except OSError:
                continue
            return _loose(raw, oid)
        raw_id = bytes.fromhex(oid)
        for pack in self.packs():
            off = pack.find(raw_id)
            if off is not None:
                return self._packed(pack, off)
        raise GitReadError(f"object {oid} is not in the repository")

    def _packed(self, pack: _Pack, off: int) -> tuple[int, bytes]:
        key = (pack.number, off)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        kind, size, pos = pack.header(off)
        if size > MAX_BLOB_BYTES:
            raise GitReadError(f"object at {pack.path.name}:{off} is over {MAX_BLOB_BYTES} bytes")
        if kind == 6:  # OFS_DELTA: the base is earlier in the same pack
            rel, pos = varint(pack.data, pos)
            base_kind, base = self._packed(pack, off - rel)
            result = base_kind, _apply_delta(base, pack.inflate(pos, size))
        elif kind == 7:  # REF_DELTA: the base by id, anywhere
            n = OID_BYTES[self.hash_name]
            base_kind, base = self._object(pack.data[pos : pos + n].hex())
            result = base_kind, _apply_delta(base, pack.inflate(pos + n, size))
        elif kind in _TYPES:
            result = kind, pack.inflate(pos, size)
        else:
            raise GitReadError(f"{pack.path.name}: unknown object type {kind} at {off}")
        self._remember(key, result)
        return result

    def close(self) -> None:
        for pack in self._packs or ():
            pack.close()
        self._cache.clear()

    def _remember(self, key: tuple[int, int], value: tuple[int, bytes]) -> None:
        size = len(value[1])
        if size > BASE_CACHE_BYTES // 4:
            return
        while self._cache and self._cache_bytes + size > BASE_CACHE_BYTES:
            old = next(iter(self._cache))
            self._cache_bytes -= len(self._cache.pop(old)[1])
        self._cache[key] = value
        self._cache_bytes += size


def _object_dirs(objects_dir: Path) -> list[Path]:
    out: list[Path] = []
    todo = [(objects_dir, 0)]
    while todo:
        d, depth = todo.pop(0)
        if d in out:
            continue
        out.append(d)
        if depth >= MAX_ALTERNATE_DEPTH:
            continue
        try:
            lines = (d / "info" / "alternates").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            line = line.strip()
            if line and not line.startswith("#"):
                p = Path(line)
                todo.append(((p if p.is_absolute() else (d / p)).resolve(), depth + 1))
    return out


def _loose(raw: bytes, oid: str) -> tuple[int, bytes]:
    try:
        z = zlib.decompressobj()
        data = z.decompress(raw, MAX_BLOB_BYTES + 64)
    except zlib.error as e:
        raise GitReadError(f"loose object {oid} is damaged: {e}") from None
    head, _, body = data.partition(b"\0")
    kind_name, _, size = head.partition(b" ")
    kinds = {v: k for k, v in _TYPES.items()}
    if kind_name not in kinds or not size.isdigit() or int(size) != len(body):
        raise GitReadError(f"loose object {oid} is damaged or over {MAX_BLOB_BYTES} bytes")
    return kinds[kind_name], body


class _Pack:
    """One pack and its v2 index; the pack is mapped, not read into memory."""

    def __init__(self, idx_path: Path, number: int, oid_len: int) -> None:
        self.path = idx_path.with_suffix(".pack")
        self.number = number
        self.oid_len = k = oid_len
        idx = idx_path.read_bytes()
        if idx[:8] != b"\377tOc\0\0\0\2":
            raise GitReadError(f"{idx_path.name}: not a version 2 pack index")
        self.fanout = struct.unpack(">256I", idx[8 : 8 + 1024])
        n = self.fanout[255]
        self.ids = idx[1032 : 1032 + n * k]
        off_at = 1032 + n * k + n * 4  # after the ids and their CRCs
        self.offsets = idx[off_at : off_at + n * 4]
        self.large = idx[off_at + n * 4 :]
        self._map: mmap.mmap | None = None

    @property
    def data(self) -> mmap.mmap:
        if self._map is None:
            with open(self.path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        return self._map

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None

    def find(self, raw_id: bytes) -> int | None:
        k = self.oid_len
        first = raw_id[0]
        lo = self.fanout[first - 1] if first else 0
        hi = self.fanout[first]
        while lo < hi:
            mid = (lo + hi) // 2
            got = self.ids[mid * k : (mid + 1) * k]
            if got == raw_id:
                (off,) = struct.unpack(">I", self.offsets[mid * 4 : mid * 4 + 4])
                if off & 0x80000000:
                    i = (off & 0x7FFFFFFF) * 8
                    (off,) = struct.unpack(">Q", self.large[i : i + 8])
                return int(off)
            if got < raw_id:
                lo = mid + 1
            else:
                hi = mid
        return None

    def header(self, off: int) -> tuple[int, int, int]:
        data = self.data
        b = data[off]
        kind, size, shift, pos = (b >> 4) & 7, b & 0x0F, 4, off + 1
        while b & 0x80:
            b = data[pos]
            size |= (b & 0x7F) << shift
            shift += 7
            pos += 1
        return kind, size, pos

    def inflate(self, pos: int, size: int) -> bytes:
        # Deflate grows incompressible data by 5 bytes per 64 KiB block at
        # most, so this slice always holds the whole stream.
        end = pos + size + size // 1024 + 64
        try:
            out = zlib.decompressobj().decompress(self.data[pos:end], size + 1)
        except zlib.error as e:
            raise GitReadError(f"{self.path.name}: damaged object data at {pos}: {e}") from None
        if len(out) != size:
            raise GitReadError(f"{self.path.name}: object at {pos} has the wrong size")
        return out


def _apply_delta(base: bytes, delta: bytes) -> bytes:
    def size_at(pos: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            b = delta[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return value, pos

    base_size, pos = size_at(0)
    out_size, pos = size_at(pos)
    if base_size != len(base) or out_size > MAX_BLOB_BYTES:
        raise GitReadError("a delta does not fit its base (damaged pack)")
    out = bytearray()
    n = len(delta)
    while pos < n:
        op = delta[pos]
        pos += 1
        if op & 0x80:  # copy from the base
            off = length = 0
            for i in range(4):
                if op & (1 << i):
                    off |= delta[pos] << (8 * i)
                    pos += 1
            for i in range(3):
                if op & (0x10 << i):
                    length |= delta[pos] << (8 * i)
                    pos += 1
            length = length or 0x10000
            if off + length > len(base):
                raise GitReadError("a delta copies beyond its base (damaged pack)")
            out += base[off : off + length]
        elif op:  # insert literal bytes
            out += delta[pos : pos + op]
            pos += op
        else:
            raise GitReadError("a delta has a reserved instruction (damaged pack)")
    if len(out) != out_size:
        raise GitReadError("a delta produced the wrong size (damaged pack)")
    return bytes(out)
