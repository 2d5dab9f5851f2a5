"""Push (or export) built images to any OCI registry with skopeo.

The registry protocol and its auth are not ours to write: skopeo (Debian's
``skopeo``, containers/image underneath, the library podman and CRI-O use)
copies an OCI layout dir (``oci:DIR:TAG``) to ``docker://REGISTRY/REPO:TAG``
and handles what registries do: token (bearer) and basic auth, docker
``config.json`` with ``auths``, ``credHelpers`` and ``credsStore`` (it runs
``docker-credential-*``), containers ``auth.json``, chunked uploads, blob
mounts and retries. We hand it an OCI layout of hard links into our blob
store, so nothing is copied on disk.

TLS: verified HTTPS always, except a loopback registry that speaks plain
HTTP (the local cluster's) or an explicit ``insecure``. A private CA is
given with ``ca_file`` (copied into a skopeo cert dir).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sandman.harness.images.oci import MEDIA_INDEX, BlobStore, Image, ImageIndex
from sandman.install.images import Registry

SKOPEO = "skopeo"
# Seconds for one image copy; a 25 MB image over a slow uplink needs a few.
COPY_TIMEOUT_S = 900
# The probe that tells a plain-HTTP loopback registry from a TLS one.
PROBE_TIMEOUT_S = 3.0


class PushError(RuntimeError):
    pass


@dataclass(frozen=True)
class PushOptions:
    registry: Registry
    insecure: bool = False  # plain HTTP / unverified TLS, by explicit choice only
    authfile: Path | None = None  # docker config.json or containers auth.json
    username: str | None = None  # with password: written to a private auth file
    password: str | None = None
    ca_file: Path | None = None  # the registry's CA (PEM), if not a public one


def skopeo_path() -> str:
    found = shutil.which(SKOPEO)
    if found is None:
        raise PushError(
            "skopeo not found: apt-get install skopeo (it pushes to registries with their "
            "auth; `python -m sandman.harness.prereqs` installs every package we need)"
        )
    return found


def write_oci_layout(image: Image | ImageIndex, store: BlobStore, tag: str, dest: Path) -> str:
    """An OCI image layout of ``image`` (one image, or an index and every image
    it lists) at ``dest`` (hard links into the store); returns the skopeo
    reference ``oci:DEST:TAG``."""
    blobs = dest / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    if isinstance(image, ImageIndex):
        top, images = image.blob, image.images
    else:
        top, images = image.manifest, (image,)
    digests = [top.digest]
    for img in images:
        digests += [img.manifest.digest, img.config.digest]
        digests += [layer.blob.digest for layer in img.layers]
    for digest in digests:
        target = blobs / digest.split(":", 1)[1]
        if target.exists():
            continue
        try:
            os.link(store.path(digest), target)
        except OSError:  # another filesystem
            shutil.copyfile(store.path(digest), target)
    (dest / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    index = {
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [
            {**top.descriptor(), "annotations": {"org.opencontainers.image.ref.name": tag}}
        ],
    }
    (dest / "index.json").write_text(json.dumps(index))
    return f"oci:{dest}:{tag}"


def split_host(host: str) -> tuple[str, int]:
    """``host[:port]`` / ``[v6]:port`` -> (name, port); 443 when none is given."""
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        return name, int(rest[1:]) if rest.startswith(":") else 443
    name, _, port = host.partition(":")
    return name, int(port) if port else 443


def speaks_tls(host: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """True if ``host[:port]`` completes a TLS handshake (certificate not checked)."""
    name, port = split_host(host)
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((name, port), timeout=timeout_s) as raw,
            ctx.wrap_socket(raw, server_hostname=name),
        ):
            return True
    except ssl.SSLError:
        return False
    except OSError as e:
        raise PushError(f"registry {host} is not reachable: {e}") from e


def tls_verify(opts: PushOptions) -> bool:
    """Whether skopeo must verify TLS (see the module docstring for the rule)."""
    if opts.insecure:
        return False
    # Plain HTTP only to a loopback registry (the local cluster's): it never
    # leaves this machine.
    return not opts.registry.loopback or speaks_tls(opts.registry.host)


@contextlib.contextmanager
def _dest_flags(opts: PushOptions) -> Iterator[list[str]]:
    """skopeo's --dest-* flags; private files (auth, CA dir) live only meanwhile."""
    with tempfile.TemporaryDirectory(prefix="sandman-push-") as tmp:
        flags = [f"--dest-tls-verify={'true' if tls_verify(opts) else 'false'}"]
        if opts.ca_file is not None:
            certs = Path(tmp) / "certs"
            certs.mkdir()
            shutil.copyfile(opts.ca_file, certs / "ca.crt")
            flags.append(f"--dest-cert-dir={certs}")
        if opts.username is not None:
            # An auth file rather than --dest-creds: a password in argv is
            # readable by every user of the machine (ps, /proc/PID/cmdline).
            token = base64.b64encode(f"{opts.username}:{opts.password or ''}".encode()).decode()
            auth = Path(tmp) / "auth.json"
            fd = os.open(auth, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"auths": {opts.registry.host: {"auth": token}}}, f)
            flags.append(f"--dest-authfile={auth}")
        elif opts.authfile is not None:
            if not opts.authfile.exists():
                raise PushError(f"auth file {opts.authfile} does not exist")
            flags.append(f"--dest-authfile={opts.authfile}")
        yield flags


def explain(stderr: str, opts: PushOptions) -> str:
    """skopeo's error, with what to do about the usual ones."""
    low = stderr.lower()
    where = str(opts.registry)
    if "unauthorized" in low or "authentication required" in low or "denied" in low:
        return (
            f"registry {where} refused the push: authentication required or denied. "
            f"Log in first (`skopeo login {opts.registry.host}` or `docker login "
            f"{opts.registry.host}`: ~/.docker/config.json and its credential helpers are "
            "read), or pass --authfile FILE, or --username USER --password-stdin.\n"
            f"skopeo said: {stderr.strip()[-800:]}"
        )
    if "x509" in low or "certificate" in low:
        return (
            f"TLS to {where} failed: the registry's certificate is not trusted. Pass "
            "--ca-file with its CA (PEM), or --insecure if you accept an unverified "
            f"connection.\nskopeo said: {stderr.strip()[-800:]}"
        )
    if "http response to https client" in low:
        return (
            f"{where} speaks plain HTTP; that is allowed only for a loopback registry or "
            f"with --insecure.\nskopeo said: {stderr.strip()[-800:]}"
        )
    return f"pushing to {where} failed: {stderr.strip()[-1500:]}"


def copy(src: str, dest: str, opts: PushOptions, extra: list[str] | None = None) -> None:
    argv = [skopeo_path(), "copy", "--retry-times=2", *(extra or [])]
    with _dest_flags(opts) as flags:
        argv += [*flags, src, dest]
        # A clean environment for credentials: only HOME/XDG (where skopeo and
        # docker keep theirs) and PATH (credential helpers) pass through.
        env = {k: v for k, v in os.environ.items() if k in ("HOME", "PATH", "XDG_RUNTIME_DIR")}
        if "DOCKER_CONFIG" in os.environ:
            env["DOCKER_CONFIG"] = os.environ["DOCKER_CONFIG"]
        try:
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=COPY_TIMEOUT_S, env=env
            )
        except subprocess.TimeoutExpired as e:
            raise PushError(f"skopeo copy to {dest} timed out after {COPY_TIMEOUT_S}s") from e
    if proc.returncode != 0:
        raise PushError(explain(proc.stderr, opts))


def push(
    image: Image | ImageIndex, store: BlobStore, ref: str, opts: PushOptions, work: Path
) -> str:
    """Push ``image`` as ``ref`` (``HOST/REPO:TAG`` in ``opts.registry``); returns it.

    An index goes with every image it lists (skopeo's ``--all``: without it
    skopeo copies only the one for this machine), so each node pulls its own.
    """
    tag = ref.rsplit(":", 1)[1]
    layout = Path(tempfile.mkdtemp(prefix="oci-push-", dir=work))
    try:
        src = write_oci_layout(image, store, tag, layout)
        copy(src, f"docker://{ref}", opts, ["--all"] if isinstance(image, ImageIndex) else None)
    finally:
        shutil.rmtree(layout, ignore_errors=True)
    return ref


def export_archive(
    image: Image, store: BlobStore, name: str, tag: str, out: Path, work: Path
) -> Path:
    """A docker-archive tarball of ``name:tag`` (for `kind load image-archive`)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    layout = Path(tempfile.mkdtemp(prefix=f"oci-{name}-", dir=work))
    try:
        src = write_oci_layout(image, store, tag, layout)
        out.unlink(missing_ok=True)
        proc = subprocess.run(
            [skopeo_path(), "copy", src, f"docker-archive:{out}:{name}:{tag}"],
            capture_output=True,
            text=True,
            timeout=COPY_TIMEOUT_S,
        )
    finally:
        shutil.rmtree(layout, ignore_errors=True)
    if proc.returncode != 0:
        raise PushError(f"export of {name}:{tag} failed: {proc.stderr.strip()[-1500:]}")
    return out
