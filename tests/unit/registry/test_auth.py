"""Credentials from docker configs and pull secrets, matched as the kubelet does."""

from __future__ import annotations

import base64
import json

import pytest

from sandman.registry_auth import AuthConfigError, Keychain, parse_challenge


def _auth(user: str, pw: str) -> dict[str, str]:
    return {"auth": base64.b64encode(f"{user}:{pw}".encode()).decode()}


def secret(name: str, auths: dict, kind: str = "kubernetes.io/dockerconfigjson") -> dict:
    key = ".dockerconfigjson" if kind.endswith("json") else ".dockercfg"
    doc = {"auths": auths} if key == ".dockerconfigjson" else auths
    raw = base64.b64encode(json.dumps(doc).encode()).decode()
    return {"metadata": {"namespace": "ns", "name": name}, "type": kind, "data": {key: raw}}


def test_most_specific_key_first_as_the_kubelet_orders_them() -> None:
    chain = Keychain.from_docker_config(
        {
            "auths": {
                "https://reg.example.com/v2/": _auth("host", "1"),
                "reg.example.com/team": _auth("team", "2"),
                "reg.example.com/team/app": _auth("app", "3"),
                "*.example.com": _auth("wild", "4"),
                "reg.example.com:5000": _auth("port", "5"),
            }
        }
    )
    users = [c.username for c in chain.lookup("reg.example.com", "team/app")]
    # path length first (app > team > host), then exact host over wildcard
    assert users == ["app", "team", "host", "wild"]
    assert [c.username for c in chain.lookup("reg.example.com", "teamx/app")] == ["host", "wild"]
    assert [c.username for c in chain.lookup("reg.example.com:5000", "x")] == ["port"]
    # a wildcard covers one label only
    assert chain.lookup("a.b.example.com", "x") == []


def test_docker_hub_keys_match_every_alias() -> None:
    chain = Keychain.from_docker_config({"auths": {"https://index.docker.io/v1/": _auth("u", "p")}})
    assert [c.username for c in chain.lookup("docker.io", "library/busybox")] == ["u"]


def test_pull_secrets_both_types_and_their_errors() -> None:
    a = Keychain.from_secret(secret("new", {"r.io": {"username": "u1", "password": "p1"}}))
    b = Keychain.from_secret(secret("old", {"r.io": _auth("u2", "p2")}, "kubernetes.io/dockercfg"))
    both = Keychain.merge([a, b])
    creds = both.lookup("r.io", "x/y")
    assert [(c.username, c.password, c.source) for c in creds] == [
        ("u1", "p1", "secret ns/new"),
        ("u2", "p2", "secret ns/old"),
    ]
    assert "p1" not in repr(creds[0])  # secrets never show in logs
    with pytest.raises(AuthConfigError, match="secret ns/opaque: type 'Opaque'"):
        Keychain.from_secret({**secret("opaque", {}), "type": "Opaque"})
    with pytest.raises(AuthConfigError, match="not base64 of user:password"):
        Keychain.from_secret(secret("bad", {"r.io": {"auth": "bm9jb2xvbg=="}}))  # "nocolon"


def test_credential_ident_is_stable_and_hides_the_secret() -> None:
    a = Keychain.from_docker_config({"r.io": _auth("u", "p")}).lookup("r.io", "x")[0]
    b = Keychain.from_docker_config({"r.io": _auth("u", "p")}).lookup("r.io", "x")[0]
    assert a.ident == b.ident and len(a.ident) == 16
    assert (
        a.ident
        != Keychain.from_docker_config({"r.io": _auth("u", "q")}).lookup("r.io", "x")[0].ident
    )


def test_docker_config_file_absent_is_empty(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert len(Keychain.from_docker_config_file(tmp_path / "nope.json")) == 0
    (tmp_path / "c.json").write_text(json.dumps({"auths": {"r.io": _auth("u", "p")}}))
    assert len(Keychain.from_docker_config_file(tmp_path / "c.json")) == 1


def test_parse_challenge() -> None:
    scheme, params = parse_challenge(
        'Bearer realm="https://auth.docker.io/token",service="registry.docker.io",'
        'scope="repository:library/busybox:pull"'
    )
    assert scheme == "bearer"
    assert params == {
        "realm": "https://auth.docker.io/token",
        "service": "registry.docker.io",
        "scope": "repository:library/busybox:pull",
    }
    assert parse_challenge('Basic realm="Registry Realm"') == ("basic", {"realm": "Registry Realm"})
    assert parse_challenge("") == ("", {})
