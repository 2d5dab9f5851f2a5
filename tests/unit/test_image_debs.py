"""Debian's packages for another architecture: version order, the signed
Release file's hashes, the Packages index, the newest of each package, and
the ELF dependencies a sysroot's interpreter needs (pure, no network)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sandman.harness.images import debs

# (a, b, a compared to b): deb-version(7)'s rules, on versions the indexes hold.
VERSION_CASES = [
    ("3.11.2-6+deb12u9", "3.11.2-6+deb12u6", 1),  # a security update is newer
    ("3.11.2-6+deb12u6", "3.11.2-6", 1),
    ("1:1.2.13.dfsg-1", "1.2.14-1", 1),  # the epoch wins
    ("1.0.8-5+b1", "1.0.8-5", 1),  # a binNMU is newer
    ("3.0.19-1~deb12u2", "3.0.19-1", -1),  # ~ sorts before everything, even the end
    ("1.0~rc1", "1.0", -1),
    ("2.36-9+deb12u14", "2.36-9+deb12u4", 1),  # digits compare as numbers
    ("1.0a", "1.0+", -1),  # letters sort before other characters
    ("1.01", "1.1", 0),  # leading zeros do not count
    ("12.2.0-14+deb12u1", "12.2.0-14+deb12u1", 0),
    ("7.2+dfsg-7+deb12u18+b3", "7.2+dfsg-7+deb12u18", 1),
]


@pytest.mark.parametrize(("a", "b", "want"), VERSION_CASES)
def test_compare_versions(a: str, b: str, want: int) -> None:
    assert debs.compare_versions(a, b) == want
    assert debs.compare_versions(b, a) == -want


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="dpkg is the reference")
def test_compare_versions_agrees_with_dpkg() -> None:
    for a, b, want in VERSION_CASES:
        op = {1: "gt", 0: "eq", -1: "lt"}[want]
        assert subprocess.run(["dpkg", "--compare-versions", a, op, b]).returncode == 0, (a, b)


RELEASE = """\
Origin: Debian
Suite: stable
Codename: bookworm
MD5Sum:
 0123456789abcdef0123456789abcdef  8689464 main/binary-arm64/Packages.xz
SHA256:
 {good}  8689464 main/binary-arm64/Packages.xz
 {other}    1234 main/binary-amd64/Packages.xz
"""


def test_release_entry_reads_the_sha256_section() -> None:
    text = RELEASE.format(good="a" * 64, other="b" * 64)
    assert debs.release_entry(text, "main/binary-arm64/Packages.xz") == ("a" * 64, 8689464)
    assert debs.release_entry(text, "main/binary-amd64/Packages.xz") == ("b" * 64, 1234)
    # The MD5 line of the same file is never taken for a SHA256.
    with pytest.raises(debs.DebError, match="no SHA256 for main/binary-riscv64"):
        debs.release_entry(text, "main/binary-riscv64/Packages.xz")


PACKAGES = """\
Package: libc6
Source: glibc
Version: 2.36-9+deb12u14
Architecture: arm64
Multi-Arch: same
Depends: libgcc-s1
Description: GNU C Library: Shared libraries
 Contains the standard libraries that are used by nearly all programs on
 the system.
Filename: pool/main/g/glibc/libc6_2.36-9+deb12u14_arm64.deb
Size: 2324660
SHA256: {c}

Package: python3.11-minimal
Version: 3.11.2-6+deb12u6
Architecture: arm64
Filename: pool/main/p/python3.11/python3.11-minimal_3.11.2-6+deb12u6_arm64.deb
Size: 1861000
SHA256: {p}
"""


def test_parse_packages_keeps_only_what_is_wanted() -> None:
    text = PACKAGES.format(c="c" * 64, p="d" * 64)
    got = debs.parse_packages(text, "http://m/debian", wanted=["libc6"])
    assert got == [
        debs.Deb(
            package="libc6",
            version="2.36-9+deb12u14",
            arch="arm64",
            filename="pool/main/g/glibc/libc6_2.36-9+deb12u14_arm64.deb",
            sha256="c" * 64,
            size=2324660,
            mirror="http://m/debian",
        )
    ]
    assert got[0].url == "http://m/debian/pool/main/g/glibc/libc6_2.36-9+deb12u14_arm64.deb"
    assert got[0].basename == "libc6_2.36-9+deb12u14_arm64.deb"
    assert len(debs.parse_packages(text, "http://m/debian")) == 2


def _deb(pkg: str, version: str, mirror: str = "http://m") -> debs.Deb:
    return debs.Deb(pkg, version, "arm64", f"pool/{pkg}_{version}.deb", "0" * 64, 1, mirror)


def test_newest_across_suites() -> None:
    # The release has the first version, -security the update: the update wins
    # and comes from its own mirror; the result is in the order asked for.
    found = [
        _deb("python3.11-minimal", "3.11.2-6+deb12u6"),
        _deb("libc6", "2.36-9+deb12u14"),
        _deb("python3.11-minimal", "3.11.2-6+deb12u9", "http://sec"),
        _deb("libc6", "2.36-9+deb12u4"),
    ]
    got = debs.newest(found, ["python3.11-minimal", "libc6"])
    assert [(d.package, d.version, d.mirror) for d in got] == [
        ("python3.11-minimal", "3.11.2-6+deb12u9", "http://sec"),
        ("libc6", "2.36-9+deb12u14", "http://m"),
    ]
    with pytest.raises(debs.DebError, match="not in Debian's index: libfoo"):
        debs.newest(found, ["libc6", "libfoo"])


def test_set_key_names_exactly_the_files() -> None:
    a = [_deb("libc6", "1"), _deb("zlib1g", "2")]
    assert debs.set_key(a) == debs.set_key(list(reversed(a)))  # order does not matter
    assert debs.set_key(a) != debs.set_key([_deb("libc6", "1"), _deb("zlib1g", "3")])
    assert len(debs.set_key(a)) == debs.KEY_CHARS


# -- ELF -------------------------------------------------------------------------------
HOST_ELF = Path("/usr/bin/python3.11")


@pytest.mark.skipif(not HOST_ELF.exists(), reason="Debian's python3.11 is the example")
def test_elf_needed_matches_readelf() -> None:
    got = debs.elf_needed(HOST_ELF)
    if shutil.which("readelf"):
        out = subprocess.run(["readelf", "-d", str(HOST_ELF)], capture_output=True, text=True)
        want = [
            line.split("[", 1)[1].rstrip("]")
            for line in out.stdout.splitlines()
            if "(NEEDED)" in line
        ]
        assert got == want
    assert "libc.so.6" in got


def test_elf_needed_refuses_other_files(tmp_path: Path) -> None:
    f = tmp_path / "script"
    f.write_text("#!/bin/sh\n")
    with pytest.raises(debs.DebError, match="not a 64-bit little-endian ELF"):
        debs.elf_needed(f)


@pytest.mark.skipif(not HOST_ELF.exists(), reason="Debian's python3.11 is the example")
def test_library_closure_in_a_sysroot(tmp_path: Path) -> None:
    # A sysroot holding the host's own libraries: the closure is what ldd finds
    # (libc.so.6 itself needs the loader).
    libdir = tmp_path / "usr/lib/x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    for name in [*debs.elf_needed(HOST_ELF), "ld-linux-x86-64.so.2"]:
        shutil.copy2(Path("/lib/x86_64-linux-gnu") / name, libdir / name)
    got = debs.library_closure([HOST_ELF], [libdir])
    assert set(got) == {*debs.elf_needed(HOST_ELF), "ld-linux-x86-64.so.2"}
    assert all(p.parent == libdir for p in got.values())
    (libdir / "libz.so.1").unlink()
    with pytest.raises(debs.DebError, match=r"libz\.so\.1 not found"):
        debs.library_closure([HOST_ELF], [libdir])
