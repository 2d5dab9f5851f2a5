"""Debian's packages for another architecture, fetched and unpacked without apt.

Images for arm64 carry Debian's arm64 python3.11 and libraries, and the tests
run them under Debian's qemu-user-static: the same packages of the same suite
the host runs, from the same mirror, for the other architecture. apt on the
host cannot give them without changing the host (``dpkg --add-architecture``,
and python3.11-minimal:arm64 would replace the host's interpreter), so this
module does what apt does for a download, in the cache only:

1. ``InRelease`` of each suite, its signature checked with ``gpgv`` against
   Debian's archive keyring (the host's ``debian-archive-keyring``);
2. ``main/binary-<arch>/Packages.xz``, checked against the SHA256 that the
   signed ``InRelease`` lists;
3. the newest version of each wanted package across the suites (Debian's
   version order), its ``.deb`` checked against the SHA256 its index lists;
4. ``dpkg-deb -x`` of every ``.deb`` of a set into one directory (a
   "sysroot") named by the set's hashes, so the same packages are unpacked once.

Indexes and ``.deb`` files are cached under ``<cache>/debs/`` (by hash); an
index is fetched again after ``INDEX_MAX_AGE_S``, and a cached one is used,
with a note, when the mirror cannot be reached.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import lzma
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from sandman.harness.images import platforms
from sandman.harness.images.platforms import Arch

Progress = Callable[[str], None]

MIRROR = "http://deb.debian.org/debian"
SECURITY_MIRROR = "http://deb.debian.org/debian-security"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
# An index older than this is fetched again (a security update then changes
# the resolved versions, and with them the keys of what is built from them).
INDEX_MAX_AGE_S = 6 * 3600
HTTP_TIMEOUT_S = 120
KEY_CHARS = 16


class DebError(RuntimeError):
    pass


@dataclass(frozen=True)
class Suite:
    mirror: str
    name: str


# The host's suites (/etc/apt/sources.list.d/debian.sources): the release,
# its updates and its security updates.
BOOKWORM = (
    Suite(MIRROR, "bookworm"),
    Suite(MIRROR, "bookworm-updates"),
    Suite(SECURITY_MIRROR, "bookworm-security"),
)


@dataclass(frozen=True)
class Deb:
    package: str
    version: str
    arch: str  # "arm64", or "all"
    filename: str  # the pool path, relative to the mirror
    sha256: str
    size: int
    mirror: str

    @property
    def url(self) -> str:
        return f"{self.mirror}/{self.filename}"

    @property
    def basename(self) -> str:
        return self.filename.rsplit("/", 1)[-1]


# -- Debian version order (deb-version(7)), pure ----------------------------------
def _order(c: str) -> int:
    if c == "~":
        return -1
    if c.isalpha():
        return ord(c)
    return ord(c) + 256  # every non-letter sorts after the letters


def _compare_part(a: str, b: str) -> int:
    """dpkg's verrevcmp: alternate non-digit runs (by _order) and digit runs (numerically)."""
    i = j = 0
    while i < len(a) or j < len(b):
        diff = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) and not a[i].isdigit() else 0
            bc = _order(b[j]) if j < len(b) and not b[j].isdigit() else 0
            if ac != bc:
                return -1 if ac < bc else 1
            if i < len(a) and not a[i].isdigit():
                i += 1
            if j < len(b) and not b[j].isdigit():
                j += 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        while i < len(a) and a[i].isdigit() and j < len(b) and b[j].isdigit():
            if not diff:
                diff = (a[i] > b[j]) - (a[i] < b[j])
            i += 1
            j += 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if diff:
            return diff
    return 0


def _split_version(v: str) -> tuple[int, str, str]:
    epoch, _, rest = v.rpartition(":") if ":" in v else ("0", "", v)
    upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "")
    return int(epoch or 0), upstream, revision


def compare_versions(a: str, b: str) -> int:
    """-1, 0 or 1 as Debian orders versions ``a`` and ``b`` (``dpkg --compare-versions``)."""
    ea, ua, ra = _split_version(a)
    eb, ub, rb = _split_version(b)
    if ea != eb:
        return -1 if ea < eb else 1
    return _compare_part(ua, ub) or _compare_part(ra, rb)


# -- indexes, pure ---------------------------------------------------------------
def release_entry(inrelease: str, path: str) -> tuple[str, int]:
    """(sha256, size) that a (verified) Release file lists for ``path``."""
    in_sha256 = False
    for line in inrelease.splitlines():
        if not line.startswith(" "):
            in_sha256 = line.strip() == "SHA256:"
            continue
        if in_sha256:
            parts = line.split()
            if len(parts) == 3 and parts[2] == path:
                return parts[0], int(parts[1])
    raise DebError(f"the Release file lists no SHA256 for {path}")


def parse_packages(text: str, mirror: str, wanted: Iterable[str] | None = None) -> list[Deb]:
    """The stanzas of a ``Packages`` index (only ``wanted`` packages, if given)."""
    want = set(wanted) if wanted is not None else None
    out = []
    for stanza in text.split("\n\n"):
        if not stanza.strip():
            continue
        if want is not None:
            m = re.match(r"Package: (\S+)", stanza)
            if m is None or m.group(1) not in want:
                continue
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") or ":" not in line:
                continue  # continuation lines (descriptions) are not needed
            k, _, v = line.partition(":")
            fields[k] = v.strip()
        try:
            out.append(
                Deb(
                    package=fields["Package"],
                    version=fields["Version"],
                    arch=fields["Architecture"],
                    filename=fields["Filename"],
                    sha256=fields["SHA256"],
                    size=int(fields["Size"]),
                    mirror=mirror,
                )
            )
        except KeyError as e:
            raise DebError(f"a Packages stanza without {e}: {stanza[:200]!r}") from None
    return out


def newest(debs: Iterable[Deb], names: Sequence[str]) -> list[Deb]:
    """The newest version of each of ``names`` (in that order) among ``debs``."""
    best: dict[str, Deb] = {}
    for d in debs:
        cur = best.get(d.package)
        if cur is None or compare_versions(d.version, cur.version) > 0:
            best[d.package] = d
    missing = [n for n in names if n not in best]
    if missing:
        raise DebError(f"not in Debian's index: {', '.join(missing)}")
    return [best[n] for n in names]


def set_key(debs: Iterable[Deb]) -> str:
    """A short key naming exactly these package files."""
    h = hashlib.sha256()
    for d in sorted(debs, key=lambda d: d.package):
        h.update(f"{d.package}={d.version}:{d.sha256}\n".encode())
    return h.hexdigest()[:KEY_CHARS]


# -- fetching --------------------------------------------------------------------
def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _download(url: str, dest: Path, sha256: str | None = None) -> None:
    """``url`` into ``dest`` (atomically), checked against ``sha256`` if given."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    tmp = Path(tmp_name)
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as resp:
                    for chunk in iter(lambda: resp.read(1 << 20), b""):
                        h.update(chunk)
                        out.write(chunk)
            except (urllib.error.URLError, OSError) as e:
                raise DebError(f"download of {url} failed: {e}") from e
        if sha256 is not None and h.hexdigest() != sha256:
            raise DebError(f"{url}: sha256 {h.hexdigest()}, the signed index says {sha256}")
        tmp.replace(dest)
    finally:
        tmp.unlink(missing_ok=True)


def _verified_release(signed: Path) -> str:
    """The text of an InRelease file whose signature gpgv accepts (Debian's keyring)."""
    if shutil.which("gpgv") is None or not KEYRING.exists():
        raise DebError(
            f"gpgv and {KEYRING} are needed to check Debian's indexes "
            "(apt-get install gpgv debian-archive-keyring)"
        )
    proc = subprocess.run(
        ["gpgv", "--keyring", str(KEYRING), "--output", "-", str(signed)],
        capture_output=True,
    )
    if proc.returncode != 0:
        raise DebError(f"{signed}: bad signature: {proc.stderr.decode(errors='replace')[-500:]}")
    return proc.stdout.decode()


_RESOLVED: dict[tuple[object, ...], list[Deb]] = {}


class Debian:
    """Debian's packages for one architecture, cached under ``<cache>/debs``."""

    def __init__(
        self,
        cache_dir: Path,
        arch: str,
        suites: Sequence[Suite] = BOOKWORM,
        progress: Progress = _stderr,
    ) -> None:
        self.root = cache_dir / "debs"
        self.arch = arch
        self.suites = tuple(suites)
        self.progress = progress

    def _inrelease(self, suite: Suite) -> str:
        path = self.root / "index" / f"{suite.name}.InRelease"
        fresh = path.exists() and time.time() - path.stat().st_mtime < INDEX_MAX_AGE_S
        if not fresh:
            try:
                _download(f"{suite.mirror}/dists/{suite.name}/InRelease", path)
            except DebError as e:
                if not path.exists():
                    raise
                self.progress(f"note: using the cached index of {suite.name}: {e}")
        return _verified_release(path)

    def _packages(self, suite: Suite, wanted: set[str]) -> list[Deb]:
        rel = f"main/binary-{self.arch}/Packages.xz"
        sha, _size = release_entry(self._inrelease(suite), rel)
        path = self.root / "index" / f"{sha}.Packages.xz"
        if not path.exists():
            self.progress(f"fetching Debian's {suite.name} {self.arch} package index")
            _download(f"{suite.mirror}/dists/{suite.name}/{rel}", path, sha)
        text = lzma.decompress(path.read_bytes()).decode()
        return parse_packages(text, suite.mirror, wanted)

    def resolve(self, names: Sequence[str]) -> list[Deb]:
        """The newest of each of ``names`` across the suites (indexes verified;
        answered once per process, as the keys of one build must agree)."""
        memo = (str(self.root), self.arch, self.suites, tuple(names))
        if memo not in _RESOLVED:
            with _locked(self.root / ".index.lock"):
                found = [d for s in self.suites for d in self._packages(s, set(names))]
            _RESOLVED[memo] = newest(found, names)
        return list(_RESOLVED[memo])

    def fetch(self, deb: Deb) -> Path:
        """The ``.deb`` file (downloaded once, checked against its index's SHA256)."""
        path = self.root / "pool" / deb.sha256[:KEY_CHARS] / deb.basename
        if not path.exists():
            self.progress(f"fetching {deb.basename} ({deb.size / 1e6:.1f} MB)")
            _download(deb.url, path, deb.sha256)
        return path

    def sysroot(self, names: Sequence[str]) -> Path:
        """A directory holding every file of ``names``'s packages (unpacked once)."""
        debs = self.resolve(names)
        final = self.root / f"sysroot-{self.arch}-{set_key(debs)}"
        if (final / ".complete").exists():
            return final
        with _locked(self.root / ".sysroot.lock"):
            if (final / ".complete").exists():
                return final
            files = [self.fetch(d) for d in debs]
            tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=self.root))
            try:
                for f in files:
                    proc = subprocess.run(["dpkg-deb", "-x", str(f), str(tmp)], capture_output=True)
                    if proc.returncode != 0:
                        raise DebError(f"dpkg-deb -x {f}: {proc.stderr.decode()[-500:]}")
                (tmp / ".complete").write_text("".join(f"{d.package}={d.version}\n" for d in debs))
                shutil.rmtree(final, ignore_errors=True)
                tmp.rename(final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return final

    def extract_file(self, name: str, member: str, dest: Path) -> Path:
        """One file (``member``, e.g. ``usr/bin/qemu-aarch64-static``) of package
        ``name`` at ``dest`` (done once per package version)."""
        (deb,) = self.resolve([name])
        out = dest / f"{deb.package}-{deb.sha256[:KEY_CHARS]}" / Path(member).name
        if out.exists():
            return out
        path = self.fetch(deb)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}")
        with open(tmp, "wb") as f:
            fsys = subprocess.Popen(
                ["dpkg-deb", "--fsys-tarfile", str(path)], stdout=subprocess.PIPE
            )
            tar = subprocess.run(
                ["tar", "-xO", f"./{member}"], stdin=fsys.stdout, stdout=f, stderr=subprocess.PIPE
            )
            assert fsys.stdout is not None
            fsys.stdout.close()
            fsys.wait()
        if fsys.returncode != 0 or tar.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise DebError(f"{member} not extracted from {path}: {tar.stderr.decode()[-500:]}")
        tmp.chmod(0o755)
        tmp.rename(out)
        return out


QEMU_PACKAGE = "qemu-user-static"


def qemu_user(cache_dir: Path, arch: Arch, progress: Progress = _stderr) -> Path:
    """Debian's ``qemu-<machine>-static`` for running ``arch``'s programs on this
    machine: one file of the host architecture's qemu-user-static, cached
    (nothing is installed on the host; no binfmt_misc registration needed,
    as it is given the program to run)."""
    deb = Debian(cache_dir, platforms.host().name, progress=progress)
    member = f"usr/bin/qemu-{arch.machine}-static"
    return deb.extract_file(QEMU_PACKAGE, member, cache_dir / "debs" / "tools")


# -- ELF dependencies (any architecture, without running anything) --------------------
def elf_needed(path: Path) -> list[str]:
    """The DT_NEEDED sonames of a 64-bit little-endian ELF file (readelf -d, in Python)."""
    import struct

    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise DebError(f"{path} is not a 64-bit little-endian ELF file")
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
            "<IIQQQQ", data, phoff + i * phentsize
        )
        if p_type == 1:  # PT_LOAD
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == 2:  # PT_DYNAMIC
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return []  # static

    def offset(vaddr: int) -> int:
        for v, o, size in loads:
            if v <= vaddr < v + size:
                return vaddr - v + o
        raise DebError(f"{path}: address {vaddr:#x} outside its segments")

    needed, strtab = [], None
    for i in range(dynamic[1] // 16):
        tag, val = struct.unpack_from("<qQ", data, dynamic[0] + i * 16)
        if tag == 0:  # DT_NULL
            break
        if tag == 1:  # DT_NEEDED
            needed.append(val)
        elif tag == 5:  # DT_STRTAB
            strtab = offset(val)
    if strtab is None:
        raise DebError(f"{path}: DT_NEEDED without DT_STRTAB")
    return [data[strtab + n : data.index(b"\0", strtab + n)].decode() for n in needed]


def library_closure(
    elfs: Iterable[Path], libdirs: Sequence[Path], extra: Iterable[str] = ()
) -> dict[str, Path]:
    """soname -> file in ``libdirs`` for everything ``elfs`` (and ``extra``) load,
    transitively: what ``ldd`` answers, for a sysroot of another architecture."""
    found: dict[str, Path] = {}
    todo = [n for e in elfs for n in elf_needed(e)] + list(extra)
    while todo:
        soname = todo.pop()
        if soname in found:
            continue
        for d in libdirs:
            if (d / soname).exists():
                found[soname] = d / soname
                break
        else:
            raise DebError(f"{soname} not found in {', '.join(map(str, libdirs))}")
        todo += elf_needed(found[soname].resolve())
    return found
