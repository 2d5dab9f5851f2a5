"""Kubeconfigs as kubectl reads them, against a local HTTPS server that checks
who is calling (bearer token or client certificate), as an apiserver does.

Covered: an exec plugin (relative command, token renewed after a 401 and
before its expiry, a failing plugin named in the error), several files in
KUBECONFIG (the first to define a name or current-context wins), contexts and
``--context``, relative certificate and token-file paths, ``tls-server-name``,
the default namespace from the context, in-cluster service-account files
(token re-read when rotated) and the order kubectl picks a config in.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import ssl
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from sandman import tls
from sandman.client import SandmanClient
from sandman.kube_async import (
    PODS,
    ApiError,
    KubeClient,
    KubeconfigError,
    kubeconfig_paths,
    load_credentials,
    load_incluster,
    load_kubeconfig,
)

NOW = dt.datetime.now(dt.UTC)
EXEC_API = "client.authentication.k8s.io/v1"


@dataclass
class Pki:
    ca: tls.KeyPair
    server: tls.KeyPair  # SANs: kubernetes.test and 127.0.0.1
    server_dns_only: tls.KeyPair  # SAN kubernetes.test only (tls-server-name)
    client: tls.KeyPair  # CN alice

    @classmethod
    def make(cls) -> Pki:
        ca = tls.new_ca("test-ca", now=NOW, valid_for=dt.timedelta(days=1))
        day = dt.timedelta(days=1)
        return cls(
            ca,
            tls.issue(
                ca, "apiserver", now=NOW, valid_for=day, dns=["kubernetes.test"],
                ips=["127.0.0.1"], server=True,
            ),
            tls.issue(
                ca, "apiserver", now=NOW, valid_for=day, dns=["kubernetes.test"], server=True
            ),
            tls.issue(ca, "alice", now=NOW, valid_for=day, client=True),
        )  # fmt: skip


@pytest.fixture(scope="module")
def pki() -> Pki:
    return Pki.make()


@dataclass
class Server:
    url: str
    tokens: set[str] = field(default_factory=set)  # bearer tokens it accepts
    seen: list[str] = field(default_factory=list)  # who each answered request was


async def _serve(tmp: Path, pki: Pki, cert: tls.KeyPair) -> AsyncIterator[Server]:
    (tmp / "srv.crt").write_bytes(cert.cert_pem)
    (tmp / "srv.key").write_bytes(cert.key_pem)
    (tmp / "srv-ca.crt").write_bytes(pki.ca.cert_pem)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tmp / "srv.crt", tmp / "srv.key")
    ctx.load_verify_locations(tmp / "srv-ca.crt")
    ctx.verify_mode = ssl.CERT_OPTIONAL
    server = Server("")

    async def pod(request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization")
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        if auth:
            token = auth.removeprefix("Bearer ")
            if token not in server.tokens:
                return web.json_response({"kind": "Status", "code": 401}, status=401)
            who = f"token:{token}"
        elif peer:
            who = "cert:" + dict(x[0] for x in peer["subject"])["commonName"]
        else:
            return web.json_response({"kind": "Status", "code": 401}, status=401)
        server.seen.append(who)
        return web.json_response({"metadata": {"name": request.match_info["name"]}, "who": who})

    async def watch(request: web.Request) -> web.StreamResponse:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if token not in server.tokens:
            return web.json_response({"kind": "Status", "code": 401}, status=401)
        resp = web.StreamResponse()
        await resp.prepare(request)
        event = {"type": "ADDED", "object": {"metadata": {"name": token}}}
        await resp.write(json.dumps(event).encode() + b"\n")
        return resp

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", pod)
    app.router.add_get("/api/v1/namespaces/{ns}/pods", watch)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    server.url = f"https://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield server
    finally:
        await runner.cleanup()


@pytest.fixture
async def apiserver(tmp_path: Path, pki: Pki) -> AsyncIterator[Server]:
    async for s in _serve(tmp_path, pki, pki.server):
        yield s


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def kubeconfig(
    *,
    clusters: dict[str, dict[str, Any]],
    users: dict[str, dict[str, Any]],
    contexts: dict[str, dict[str, Any]],
    current: str | None = None,
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": n, "cluster": c} for n, c in clusters.items()],
        "users": [{"name": n, "user": u} for n, u in users.items()],
        "contexts": [{"name": n, "context": c} for n, c in contexts.items()],
    }
    if current:
        doc["current-context"] = current
    return doc


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


async def who(creds_or_path: Any, **kw: Any) -> str:
    """Who the server saw for one GET through a KubeClient."""
    kube = (
        KubeClient.from_kubeconfig(creds_or_path, **kw)
        if isinstance(creds_or_path, (str, Path))
        else KubeClient(creds_or_path)
    )
    async with kube:
        return str((await kube.get(PODS, "p", "ns"))["who"])


# -- exec plugins ----------------------------------------------------------------
PLUGIN = """#!/bin/sh
# A credential plugin as kubectl runs one: prints an ExecCredential.
here=$(dirname "$0")
echo run >> "$here/runs"
[ -f "$here/fail" ] && { echo "login required: run sso-login" >&2; exit 1; }
exp=""
[ -f "$here/expiry" ] && exp=", \\"expirationTimestamp\\": \\"$(cat "$here/expiry")\\""
printf '{"apiVersion": "%s", "kind": "ExecCredential", "status": {"token": "%s"%s}}\\n' \\
  "{api}" "$(cat "$here/token")" "$exp"
""".replace("{api}", EXEC_API)


def exec_setup(tmp: Path, server: Server, pki: Pki, token: str = "t1") -> Path:
    d = tmp / "kube"
    d.mkdir()
    plugin = d / "plugin.sh"
    plugin.write_text(PLUGIN)
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    (d / "token").write_text(token)
    (d / "ca.crt").write_bytes(pki.ca.cert_pem)
    return write(
        d / "config",
        kubeconfig(
            clusters={"c": {"server": server.url, "certificate-authority": "ca.crt"}},
            users={"u": {"exec": {"apiVersion": EXEC_API, "command": "./plugin.sh"}}},
            contexts={"x": {"cluster": "c", "user": "u", "namespace": "team-a"}},
            current="x",
        ),
    )


def runs(config: Path) -> int:
    f = config.parent / "runs"
    return len(f.read_text().split()) if f.exists() else 0


async def test_exec_plugin_token_is_used_and_renewed_after_a_401(
    tmp_path: Path, apiserver: Server, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = exec_setup(tmp_path, apiserver, pki)
    apiserver.tokens = {"t1"}
    monkeypatch.chdir("/")  # the plugin's relative path is the kubeconfig's dir, not ours
    creds = load_kubeconfig(config)
    assert (creds.namespace, runs(config)) == ("team-a", 1)
    async with KubeClient(creds) as kube:
        assert (await kube.get(PODS, "p", "ns"))["who"] == "token:t1"
        assert (await kube.get(PODS, "p", "ns"))["who"] == "token:t1"
        assert runs(config) == 1  # the loaded token is reused, not re-fetched per request
        # The credential is revoked and the plugin now hands out another one.
        apiserver.tokens = {"t2"}
        (config.parent / "token").write_text("t2")
        assert (await kube.get(PODS, "p", "ns"))["who"] == "token:t2"
    assert creds.bearer is not None and creds.bearer.renewals == 1
    assert runs(config) == 2


async def test_a_watch_refused_with_401_is_retried_with_a_renewed_token(
    tmp_path: Path, apiserver: Server, pki: Pki
) -> None:
    config = exec_setup(tmp_path, apiserver, pki)
    creds = load_kubeconfig(config)
    apiserver.tokens = {"t2"}
    (config.parent / "token").write_text("t2")
    async with KubeClient(creds) as kube:
        events = [ev async for ev in kube.watch(PODS, "ns", resource_version="1")]
    assert events == [("ADDED", {"metadata": {"name": "t2"}})]
    assert creds.bearer is not None and creds.bearer.renewals == 1


async def test_exec_plugin_token_is_renewed_before_it_expires(
    tmp_path: Path, apiserver: Server, pki: Pki
) -> None:
    config = exec_setup(tmp_path, apiserver, pki)
    # Expires in a minute: inside the loader's 5-minute margin, so due at the next check.
    soon = (dt.datetime.now(dt.UTC) + dt.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    (config.parent / "expiry").write_text(soon)
    apiserver.tokens = {"t1", "t2"}
    now = [0.0]
    creds = load_kubeconfig(config, clock=lambda: now[0])
    async with KubeClient(creds) as kube:
        assert await who(creds) == "token:t1"
        (config.parent / "token").write_text("t2")
        assert (await kube.get(PODS, "p", "ns"))["who"] == "token:t1"  # checked < 10 s ago
        now[0] += 11
        assert (await kube.get(PODS, "p", "ns"))["who"] == "token:t2"  # renewed, no 401
    assert creds.bearer is not None and creds.bearer.renewals == 0


async def test_a_failing_exec_plugin_is_an_error_that_names_its_message(
    tmp_path: Path, apiserver: Server, pki: Pki
) -> None:
    config = exec_setup(tmp_path, apiserver, pki)
    (config.parent / "fail").write_text("")
    with pytest.raises(KubeconfigError, match="login required: run sso-login"):
        load_kubeconfig(config)


# -- several files, contexts --------------------------------------------------------
def two_files(tmp: Path, server: Server, pki: Pki) -> tuple[Path, Path]:
    ca = b64(pki.ca.cert_pem)
    first = write(
        tmp / "a" / "config",
        kubeconfig(
            clusters={"shared": {"server": server.url, "certificate-authority-data": ca}},
            users={"ua": {"token": "tok-a"}},
            contexts={"a": {"cluster": "shared", "user": "ua", "namespace": "ns-a"}},
            current="a",
        ),
    )
    second = write(
        tmp / "b" / "config",
        kubeconfig(
            # Redefines "shared" (ignored: the first file's wins) and adds "b".
            clusters={
                "shared": {"server": "https://127.0.0.1:1", "certificate-authority-data": ca},
                "only-b": {"server": server.url, "certificate-authority-data": ca},
            },
            users={"ua": {"token": "wrong"}, "ub": {"token": "tok-b"}},
            contexts={
                "a": {"cluster": "only-b", "user": "ub", "namespace": "ignored"},
                "b": {"cluster": "only-b", "user": "ub"},
            },
            current="b",  # ignored: the first file to set current-context wins
        ),
    )
    return first, second


async def test_kubeconfig_list_merges_as_kubectl_does(
    tmp_path: Path, apiserver: Server, pki: Pki
) -> None:
    first, second = two_files(tmp_path, apiserver, pki)
    apiserver.tokens = {"tok-a", "tok-b"}
    env = {"KUBECONFIG": f"{first}:{tmp_path}/missing:{second}", "HOME": str(tmp_path)}
    creds = load_credentials(environ=env)
    assert (creds.server, creds.namespace) == (apiserver.url, "ns-a")
    assert await who(creds) == "token:tok-a"
    # --context picks a context the second file defines; no namespace: "default".
    b = load_credentials(context="b", environ=env)
    assert (b.namespace, await who(b)) == ("default", "token:tok-b")
    # The other order: the second file is first now, its current-context wins.
    flipped = load_credentials(environ={"KUBECONFIG": f"{second}:{first}"})
    assert flipped.namespace == "default" and await who(flipped) == "token:tok-b"


def test_unknown_context_and_no_current_context_say_which_exist(
    tmp_path: Path, apiserver: Server, pki: Pki
) -> None:
    first, _ = two_files(tmp_path, apiserver, pki)
    with pytest.raises(KubeconfigError, match=r"context 'nope' is not in .*contexts: a"):
        load_kubeconfig(first, "nope")
    doc = yaml.safe_load(first.read_text())
    del doc["current-context"]
    with pytest.raises(KubeconfigError, match="no current-context; choose one with --context"):
        load_kubeconfig(write(tmp_path / "nocur", doc))
    with pytest.raises(KubeconfigError, match="no kubeconfig file at"):
        load_kubeconfig(tmp_path / "absent")


# -- relative paths, token files, tls-server-name ------------------------------------
async def test_relative_certificate_paths_resolve_against_the_kubeconfig(
    tmp_path: Path, apiserver: Server, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "home" / ".kube"
    (d / "pki").mkdir(parents=True)
    (d / "pki" / "ca.crt").write_bytes(pki.ca.cert_pem)
    (d / "pki" / "alice.crt").write_bytes(pki.client.cert_pem)
    (d / "pki" / "alice.key").write_bytes(pki.client.key_pem)
    config = write(
        d / "config",
        kubeconfig(
            clusters={"c": {"server": apiserver.url, "certificate-authority": "pki/ca.crt"}},
            users={"alice": {"client-certificate": "pki/alice.crt", "client-key": "pki/alice.key"}},
            contexts={"x": {"cluster": "c", "user": "alice"}},
            current="x",
        ),
    )
    monkeypatch.chdir(tmp_path)  # not the kubeconfig's directory
    assert await who(load_kubeconfig(config)) == "cert:alice"
    # ~/.kube/config is the default when neither --kubeconfig nor KUBECONFIG is given.
    assert kubeconfig_paths(None, {"HOME": str(tmp_path / "home")}) == str(config)


async def test_token_file_is_read_relative_to_the_kubeconfig_and_again_after_a_401(
    tmp_path: Path, apiserver: Server, pki: Pki
) -> None:
    d = tmp_path / "kube"
    d.mkdir()
    (d / "ca.crt").write_bytes(pki.ca.cert_pem)
    (d / "token").write_text("file-1\n")
    config = write(
        d / "config",
        kubeconfig(
            clusters={"c": {"server": apiserver.url, "certificate-authority": "ca.crt"}},
            users={"sa": {"tokenFile": "token"}},
            contexts={"x": {"cluster": "c", "user": "sa", "namespace": "trainers"}},
            current="x",
        ),
    )
    apiserver.tokens = {"file-1"}
    creds = load_kubeconfig(config)
    async with KubeClient(creds) as kube:
        assert (await kube.get(PODS, "p", "ns"))["who"] == "token:file-1"
        (d / "token").write_text("file-2")  # rotated, e.g. by a projected volume
        apiserver.tokens = {"file-2"}
        assert (await kube.get(PODS, "p", "ns"))["who"] == "token:file-2"
        apiserver.tokens = set()  # a token nobody can renew: the 401 stands
        with pytest.raises(ApiError) as e:
            await kube.get(PODS, "p", "ns")
        assert e.value.status == 401


@pytest.fixture
async def dns_only_server(tmp_path: Path, pki: Pki) -> AsyncIterator[Server]:
    async for s in _serve(tmp_path, pki, pki.server_dns_only):
        yield s


async def test_tls_server_name_is_the_name_the_certificate_is_checked_against(
    tmp_path: Path, dns_only_server: Server, pki: Pki
) -> None:
    dns_only_server.tokens = {"t"}
    cluster = {"server": dns_only_server.url, "certificate-authority-data": b64(pki.ca.cert_pem)}

    def config(name: str, **extra: str) -> Path:
        return write(
            tmp_path / name,
            kubeconfig(
                clusters={"c": {**cluster, **extra}},
                users={"u": {"token": "t"}},
                contexts={"x": {"cluster": "c", "user": "u"}},
                current="x",
            ),
        )

    # The certificate names kubernetes.test, not 127.0.0.1: refused without the setting.
    with pytest.raises(Exception, match="certificate"):
        await who(config("plain"))
    creds = load_kubeconfig(config("named", **{"tls-server-name": "kubernetes.test"}))
    assert creds.tls_server_name == "kubernetes.test"
    assert await who(creds) == "token:t"


# -- in-cluster and the choice between them ------------------------------------------
async def test_in_cluster_reads_the_service_account_and_rereads_a_rotated_token(
    tmp_path: Path, apiserver: Server, pki: Pki
) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "ca.crt").write_bytes(pki.ca.cert_pem)
    (sa / "token").write_text("sa-1")
    (sa / "namespace").write_text("trainers\n")
    port = apiserver.url.rsplit(":", 1)[1]
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}
    now = [0.0]
    creds = load_incluster(sa, env, clock=lambda: now[0])
    assert (creds.server, creds.namespace) == (apiserver.url, "trainers")
    apiserver.tokens = {"sa-1", "sa-2"}
    async with KubeClient(creds) as kube:
        assert (await kube.get(PODS, "p", "ns"))["who"] == "token:sa-1"
        (sa / "token").write_text("sa-2")  # the kubelet rotated it
        now[0] += 11
        assert (await kube.get(PODS, "p", "ns"))["who"] == "token:sa-2"


def test_kubectl_order_flag_then_env_then_home_then_in_cluster(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert kubeconfig_paths("/flag", {"KUBECONFIG": "/env", "HOME": str(home)}) == "/flag"
    env_file = tmp_path / "env"
    env_file.write_text("")
    assert kubeconfig_paths(None, {"KUBECONFIG": str(env_file)}) == str(env_file)
    assert kubeconfig_paths(None, {"HOME": str(home), **pod}) is None  # no file: in-cluster
    # A KUBECONFIG naming only missing files falls back to in-cluster inside a pod...
    assert kubeconfig_paths(None, {"KUBECONFIG": "/nope", **pod}) is None
    # ...and is an error outside one.
    with pytest.raises(KubeconfigError, match="no kubeconfig file at /nope"):
        load_credentials(environ={"KUBECONFIG": "/nope", "HOME": str(home)})
    with pytest.raises(KubeconfigError, match="pass --kubeconfig, set KUBECONFIG"):
        load_credentials(environ={"HOME": str(home)})


async def test_the_sdk_defaults_to_the_contexts_namespace(
    tmp_path: Path, apiserver: Server, pki: Pki
) -> None:
    first, _ = two_files(tmp_path, apiserver, pki)
    async with SandmanClient(kubeconfig=first) as c:
        assert c.namespace == "ns-a"
    async with SandmanClient(kubeconfig=first, namespace="mine") as c:
        assert c.namespace == "mine"
