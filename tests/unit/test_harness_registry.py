"""The harness's registry: its config (plain by default, auth and TLS on request)
and the client's credentials."""

from __future__ import annotations

import base64
from pathlib import Path

from sandman.harness.images.registry import Registry, htpasswd_line, registry_config


def test_the_default_registry_is_plain_http_without_auth() -> None:
    doc = registry_config("127.0.0.1:5000", Path("/data"))
    assert doc["http"] == {"addr": "127.0.0.1:5000"}
    assert "auth" not in doc
    assert doc["storage"] == {"filesystem": {"rootdirectory": "/data"}}


def test_auth_and_tls_when_asked() -> None:
    doc = registry_config(
        "127.0.0.1:5001",
        Path("/data"),
        htpasswd=Path("/r/htpasswd"),
        tls=(Path("/r/registry.crt"), Path("/r/registry.key")),
    )
    assert doc["auth"] == {"htpasswd": {"realm": "sandman", "path": "/r/htpasswd"}}
    assert doc["http"]["tls"] == {"certificate": "/r/registry.crt", "key": "/r/registry.key"}


def test_htpasswd_is_bcrypt() -> None:
    # docker-registry accepts bcrypt entries only.
    user, _, hashed = htpasswd_line("platform", "secret").strip().partition(":")
    assert user == "platform"
    assert hashed.startswith("$2b$")


def test_the_client_sends_basic_auth_only_with_credentials() -> None:
    assert "Authorization" not in Registry("127.0.0.1:5000")._auth({"Accept": "x"})
    headers = Registry("127.0.0.1:5000", username="u", password="p")._auth({"Accept": "x"})
    assert headers["Accept"] == "x"
    assert headers["Authorization"] == "Basic " + base64.b64encode(b"u:p").decode()
