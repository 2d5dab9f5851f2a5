"""The local cluster's PKI and kubeconfigs, written once into the state dir.

Identities follow kubeadm's so the default RBAC bootstrap policy applies as is:
``kubernetes-admin`` in ``system:masters``, ``system:kube-controller-manager``,
``system:kube-scheduler``, and ``system:node:<name>`` in ``system:nodes``.
Existing files are kept, so a restarted cluster keeps working kubeconfigs.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from sandman import tls

# Ten years: this PKI lives as long as the state dir; rotation is the webhook's
# problem (it manages its own certificates), not the test cluster's.
VALIDITY = dt.timedelta(days=3650)

# The apiserver's identity towards admission webhooks (the client certificate
# its AdmissionConfiguration's kubeconfig names), under a CA of its own: the
# main CA signs every user's client certificate, and a webhook that trusted it
# would take any kubeconfig for the apiserver.
ADMISSION_CLIENT = "apiserver-admission-client"
ADMISSION_CLIENT_CA = "admission-client-ca"
ADMISSION_CLIENT_CN = "kube-apiserver-admission-client"

APISERVER_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


@dataclass(frozen=True)
class Pki:
    dir: Path

    def crt(self, name: str) -> Path:
        return self.dir / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.dir / f"{name}.key"

    @property
    def ca(self) -> Path:
        return self.crt("ca")

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"

    def _write(self, name: str, kp: tls.KeyPair) -> None:
        _write_private(self.key(name), kp.key_pem)
        self.crt(name).write_bytes(kp.cert_pem)

    def _load(self, name: str) -> tls.KeyPair:
        return tls.KeyPair(self.crt(name).read_bytes(), self.key(name).read_bytes())

    def _has(self, name: str) -> bool:
        return self.crt(name).exists() and self.key(name).exists()

    def ensure_ca(self, now: dt.datetime, name: str = "ca") -> tls.KeyPair:
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self._has(name):
            self._write(name, tls.new_ca(f"sandman-local-{name}", now=now, valid_for=VALIDITY))
        return self._load(name)

    def ensure_cert(
        self,
        name: str,
        cn: str,
        *,
        now: dt.datetime,
        orgs: tuple[str, ...] = (),
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        server: bool = False,
        client: bool = False,
        ca_name: str = "ca",
    ) -> None:
        if self._has(name):
            return
        ca = self.ensure_ca(now, ca_name)
        kp = tls.issue(
            ca,
            cn,
            now=now,
            valid_for=VALIDITY,
            orgs=orgs,
            dns=dns,
            ips=ips,
            server=server,
            client=client,
        )
        self._write(name, kp)

    def _lacks_ips(self, name: str, ips: tuple[str, ...]) -> bool:
        """The cert exists but does not name every one of ``ips`` (an address added later)."""
        if not self._has(name):
            return False
        from cryptography import x509

        cert = x509.load_pem_x509_certificate(self.crt(name).read_bytes())
        try:
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            return True
        have = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
        return not set(ips) <= have

    def ensure_control_plane(
        self, now: dt.datetime, service_ip: str, extra_ips: tuple[str, ...] = ()
    ) -> None:
        """``extra_ips``: more addresses the apiserver is reached at (the pod
        bridge's, when the real node is there); a cert without one is reissued."""
        self.ensure_ca(now)
        ips = ("127.0.0.1", service_ip, *extra_ips)
        if self._lacks_ips("apiserver", ips):
            self.crt("apiserver").unlink()
        self.ensure_cert(
            "apiserver",
            "kube-apiserver",
            now=now,
            dns=APISERVER_DNS,
            ips=ips,
            server=True,
        )
        self.ensure_cert(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            now=now,
            orgs=("system:masters",),
            client=True,
        )
        self.ensure_cert(
            "admin", "kubernetes-admin", now=now, orgs=("system:masters",), client=True
        )
        self.ensure_cert(
            "controller-manager", "system:kube-controller-manager", now=now, client=True
        )
        self.ensure_cert("scheduler", "system:kube-scheduler", now=now, client=True)
        # kwok acts for every simulated node's kubelet (status, leases, pods);
        # the node authorizer would confine it to one node, so it is an admin.
        self.ensure_cert("kwok", "kwok-controller", now=now, orgs=("system:masters",), client=True)
        # The aggregation layer's front proxy gets its own CA, as in kubeadm: a
        # cert from the main CA must not be able to assert X-Remote-User.
        self.ensure_cert(
            "front-proxy-client",
            "front-proxy-client",
            now=now,
            client=True,
            ca_name="front-proxy-ca",
        )
        self.ensure_cert(
            ADMISSION_CLIENT,
            ADMISSION_CLIENT_CN,
            now=now,
            client=True,
            ca_name=ADMISSION_CLIENT_CA,
        )
        if not self.sa_key.exists():
            priv, pub = tls.new_signing_key()
            _write_private(self.sa_key, priv)
            self.sa_pub.write_bytes(pub)


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def write_kubeconfig(
    path: Path, *, server: str, pki: Pki, cert: str, user: str, embed: bool = True
) -> None:
    """A kubeconfig for one identity; embedded certs make the file portable."""
    import base64

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    cluster: dict[str, str] = {"server": server}
    auth: dict[str, str] = {}
    if embed:
        cluster["certificate-authority-data"] = b64(pki.ca)
        auth = {
            "client-certificate-data": b64(pki.crt(cert)),
            "client-key-data": b64(pki.key(cert)),
        }
    else:
        cluster["certificate-authority"] = str(pki.ca)
        auth = {"client-certificate": str(pki.crt(cert)), "client-key": str(pki.key(cert))}
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "sandman-local", "cluster": cluster}],
        "users": [{"name": user, "user": auth}],
        "contexts": [
            {"name": "sandman-local", "context": {"cluster": "sandman-local", "user": user}}
        ],
        "current-context": "sandman-local",
        "preferences": {},
    }
    tmp = path.with_suffix(".tmp")
    _write_private(tmp, yaml.safe_dump(doc, sort_keys=False).encode())
    tmp.replace(path)
