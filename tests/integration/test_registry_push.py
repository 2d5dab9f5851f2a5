"""`sandman image push` to a registry that wants credentials and speaks TLS.

A real docker-registry (Debian's) on loopback with htpasswd auth and a
serving certificate from the project's own test CA (harness/cluster/pki.py):
a push with credentials lands (the registry then serves the manifest we
built), one without is refused with an error that says what to do, and one
that does not trust the CA is refused too. No cluster is needed.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from sandman.harness.cluster.config import default_cache_dir
from sandman.harness.cluster.pki import Pki
from sandman.harness.cluster.process import ManagedProcess, wait_until
from sandman.harness.images.build import ImageBuilder
from sandman.harness.images.push import PushError, PushOptions, push
from sandman.harness.testing import free_port
from sandman.install.images import Registry

USER, PASSWORD = "trainer", "s3cret-for-the-test"
REPO = "sandman-push-test"


def _bcrypt(password: str) -> str:
    # docker-registry's htpasswd takes bcrypt only; libcrypt makes it
    # (the crypt module is deprecated, not gone, in 3.11).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt

        return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))


@dataclass
class AuthRegistry:
    host: str
    ca: Path

    def manifest_digest(self, repo: str, tag: str) -> str:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        req = urllib.request.Request(
            f"https://{self.host}/v2/{repo}/manifests/{tag}",
            method="HEAD",
            headers={
                "Accept": "application/vnd.oci.image.manifest.v1+json",
                "Authorization": "Basic "
                + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode(),
            },
        )
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return str(r.headers["Docker-Content-Digest"])


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthRegistry]:
    for tool in ("docker-registry", "skopeo"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} missing (python -m sandman.harness.prereqs installs it)")
    root = tmp_path_factory.mktemp("auth-registry")
    pki = Pki(root / "pki")
    now = dt.datetime.now(dt.UTC)
    pki.ensure_cert("registry", "registry", now=now, dns=("localhost",), ips=("127.0.0.1",),
                    server=True)  # fmt: skip
    (root / "htpasswd").write_text(f"{USER}:{_bcrypt(PASSWORD)}\n")
    host = f"127.0.0.1:{free_port()}"
    config = {
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(root / "data")}},
        "auth": {"htpasswd": {"realm": "sandman-test", "path": str(root / "htpasswd")}},
        "http": {
            "addr": host,
            "tls": {"certificate": str(pki.crt("registry")), "key": str(pki.key("registry"))},
        },
    }
    (root / "config.yml").write_text(yaml.safe_dump(config))
    proc = ManagedProcess(
        "auth-registry",
        ("docker-registry", "serve", str(root / "config.yml")),
        root / "run",
        root / "logs",
        stop_timeout_s=5,
    )
    proc.start()
    ctx = ssl.create_default_context(cafile=str(pki.ca))

    def answers() -> bool:
        try:
            urllib.request.urlopen(f"https://{host}/v2/", context=ctx, timeout=2)
        except urllib.error.HTTPError as e:
            return e.code == 401  # up, and asking for credentials
        return False

    try:
        wait_until(proc, answers, timeout_s=30, what="serving TLS")
        yield AuthRegistry(host, pki.ca)
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def pause_image() -> tuple[ImageBuilder, object]:
    builder = ImageBuilder(default_cache_dir(), progress=lambda _m: None)
    return builder, builder.build("pause")


def _push(pause_image, registry: AuthRegistry, tag: str, **kw) -> str:  # type: ignore[no-untyped-def]
    builder, image = pause_image
    opts = PushOptions(registry=Registry.parse(registry.host), **kw)
    return push(image, builder.store, f"{registry.host}/{REPO}:{tag}", opts, builder.root)


def test_push_with_credentials_lands(pause_image, registry: AuthRegistry) -> None:  # type: ignore[no-untyped-def]
    ref = _push(pause_image, registry, "with-creds", username=USER, password=PASSWORD,
                ca_file=registry.ca)  # fmt: skip
    assert ref == f"{registry.host}/{REPO}:with-creds"
    _, image = pause_image
    assert registry.manifest_digest(REPO, "with-creds") == image.manifest.digest


def test_push_with_a_docker_config_file(
    pause_image, registry: AuthRegistry, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "config.json"
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    config.write_text(json.dumps({"auths": {registry.host: {"auth": token}}}))
    _push(pause_image, registry, "authfile", authfile=config, ca_file=registry.ca)
    _, image = pause_image
    assert registry.manifest_digest(REPO, "authfile") == image.manifest.digest


def test_push_without_credentials_is_refused_clearly(pause_image, registry: AuthRegistry) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PushError) as e:
        _push(pause_image, registry, "anonymous", ca_file=registry.ca)
    msg = str(e.value)
    assert "authentication required" in msg and "--password-stdin" in msg, msg


def test_push_to_an_untrusted_certificate_is_refused(pause_image, registry: AuthRegistry) -> None:  # type: ignore[no-untyped-def]
    # Loopback, but it speaks TLS: verified, and our CA is not given.
    with pytest.raises(PushError) as e:
        _push(pause_image, registry, "untrusted", username=USER, password=PASSWORD)
    assert "--ca-file" in str(e.value), str(e.value)


def test_cli_reads_the_password_from_stdin(registry: AuthRegistry, tmp_path: Path) -> None:
    # The CLI path end to end, with a wrong password: refused, exit 1, the advice printed.
    proc = subprocess.run(
        [
            sys.executable, "-m", "sandman.cli.main",
            "image", "push", "daemon", f"--registry={registry.host}/cli",
            f"--username={USER}", "--password-stdin", f"--ca-file={registry.ca}",
            "--version=cli-test",
        ],
        input="wrong-password\n",
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "authentication required" in proc.stderr, proc.stderr
