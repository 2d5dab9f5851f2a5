"""The webhook's serving certificate: kept in a Secret, trusted through caBundles, hot-reloaded.

Decisions live in ``cert_plan`` (pure); this module reads and writes the Secret
and the webhook configurations and swaps the cert inside one ``ssl.SSLContext``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import hashlib
import logging
import os
import ssl
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandman.clock import utc_now
from sandman.kube_async import SECRETS, ApiError, KubeClient, Resource, sleep_or
from sandman.webhook import cert_plan
from sandman.webhook.cert_plan import Cert, Material

log = logging.getLogger("sandman.webhook.certs")

# cert-manager's default renewBefore: re-issue once a third of the lifetime is
# left. For the 90-day serving cert that is 30 days of slack for a broken
# webhook to be noticed (the expiry metric) before anything fails.
DEFAULT_RENEW_FRACTION = 1 / 3
# After a failed pass, retry sooner than the normal interval: until a pass
# succeeds the webhook may serve nothing. 5 s costs a replica at most 12
# Secret reads a minute against an apiserver that is having trouble.
ERROR_RETRY_S = 5.0
# How long every caBundle must have held a new CA before the serving cert moves
# to it. Apiservers see webhook configuration changes through a watch, normally
# within a second; 10 s also covers a watch lagging under load, and only delays
# a switch that is due long before anything expires. Without it, back-to-back
# passes (start-up runs two) could switch right after patching the caBundles.
CABUNDLE_SETTLE = dt.timedelta(seconds=10)


class CertManager:
    """Keeps the webhook's serving cert valid and trusted, across replicas, without cert-manager.

    Failure it prevents: an admission webhook whose cert expires, or whose cert
    is signed by a CA the apiserver does not trust yet, fails every admission
    call (every pod create, under ``failurePolicy: Fail``). Self-managed webhook
    certs commonly break at CA rotation: the new cert goes live before the
    caBundle trusts its CA. The ordering (see ``cert_plan``) MUST hold: the
    serving cert moves to a new CA only after every caBundle has held that CA
    for CABUNDLE_SETTLE, so that every apiserver has seen it; the old CA stays
    in every caBundle until it expires. Prior art: cert-manager's cainjector and renewBefore, kopf's
    self-signed webhook certs (``_build_ssl``), client-go's ``ca@<time>`` CAs.

    Replicas coordinate through the Secret only: creation that loses the race
    (409) adopts the winner's Secret, and updates carry a resourceVersion
    precondition (409: nothing written, the next pass re-reads).

    Concurrency: safe for concurrent use by the tasks of one event loop; one
    ``asyncio.Lock`` serialises passes (``run`` and ``rotate_ca_now``). Not
    thread-safe.
    """

    def __init__(
        self,
        client: KubeClient | None,
        *,
        namespace: str,
        secret_name: str,
        dns_names: tuple[str, ...],
        ip_addresses: tuple[str, ...] = (),
        webhook_configs: tuple[tuple[Resource, str], ...] = (),
        ca_validity: dt.timedelta,
        cert_validity: dt.timedelta,
        renew_fraction: float = DEFAULT_RENEW_FRACTION,
        cert_file: Path | None = None,
        key_file: Path | None = None,
        work_dir: Path,
        client_ca_file: Path | None = None,
        clock: Callable[[], dt.datetime] = utc_now,
    ) -> None:
        if (cert_file is None) != (key_file is None):
            raise ValueError("file mode needs both cert_file and key_file")
        if cert_file is None and client is None:
            raise ValueError(
                "no source of TLS material: pass a KubeClient (Secret mode) "
                "or cert_file and key_file (mounted certs, e.g. from cert-manager)"
            )
        if not 0 < renew_fraction < 1:
            raise ValueError("renew_fraction must lie strictly between 0 and 1")
        self._client = client
        self._namespace = namespace
        self._secret_name = secret_name
        self._sans = frozenset((*dns_names, *ip_addresses))
        self._configs = webhook_configs
        self._apply = functools.partial(
            cert_plan.apply,
            ca_validity=ca_validity,
            cert_validity=cert_validity,
            dns_names=dns_names,
            ip_addresses=ip_addresses,
        )
        self._renew_fraction = renew_fraction
        self._cert_file = cert_file
        self._key_file = key_file
        self._work_dir = work_dir
        self._clock = clock
        self._lock = asyncio.Lock()
        self._ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        self._loaded_hash: str | None = None
        self._client_ca_file = client_ca_file
        self._client_ca_hash: str | None = None
        if client_ca_file is not None:
            # Optional, not required: probes and Prometheus reach /healthz,
            # /readyz and /metrics without one; the review endpoints refuse
            # a connection that presented none (webhook/caller.py). A
            # certificate that does not verify fails the handshake.
            self._ctx.verify_mode = ssl.CERT_OPTIONAL
            self._load_client_ca()
        self._missing: set[tuple[Resource, str]] = set()  # configurations last seen absent
        self._trusted_since: dict[str, dt.datetime] = {}  # CA fingerprint -> in every caBundle
        self.ready = asyncio.Event()
        self.not_after: dt.datetime | None = None
        self.ca_bundle_pem: bytes = b""

    def ssl_context(self) -> ssl.SSLContext:
        """The one server context; its cert chain is replaced in place on rotation."""
        return self._ctx

    async def reconcile(self) -> None:
        """One pass: settle the Secret, sync the caBundles, reload the cert if it changed."""
        async with self._lock:
            await self._pass_locked(force_ca_rotation=False)

    async def rotate_ca_now(self) -> None:
        """Start a CA rotation now; the serving cert follows on a later pass, as usual."""
        async with self._lock:
            await self._pass_locked(force_ca_rotation=True)

    async def run(self, stop: asyncio.Event, interval_s: float = 30.0) -> None:
        """Reconcile now and every ``interval_s`` until ``stop``; failures are logged."""
        while not stop.is_set():
            delay = interval_s
            try:
                async with self._lock:
                    if not await self._pass_locked(force_ca_rotation=False):
                        delay = min(interval_s, ERROR_RETRY_S)
            # A background task of the server: any failure (apiserver down, bad
            # files, RBAC) is logged and retried, never allowed to end serving.
            except Exception:
                delay = min(interval_s, ERROR_RETRY_S)
                log.exception("webhook TLS pass failed; retrying in %.1f s", delay)
            if await sleep_or(stop, delay):
                return

    @property
    def client_ca_required(self) -> bool:
        return self._client_ca_file is not None

    def _load_client_ca(self) -> None:
        """Trust the client CA file's certificates, again when its content changes.

        A mounted ConfigMap changes without a filesystem event, hence the hash.
        OpenSSL's store only grows: a CA removed from the file stays trusted
        until the process restarts (a rotation adds the new CA first, so
        nothing breaks in between).
        """
        assert self._client_ca_file is not None
        pem = self._client_ca_file.read_bytes()
        digest = hashlib.sha256(pem).hexdigest()
        if digest == self._client_ca_hash:
            return
        try:
            self._ctx.load_verify_locations(cadata=pem.decode())
        except (ssl.SSLError, UnicodeDecodeError, ValueError) as e:
            raise ValueError(
                f"--client-ca-file {self._client_ca_file}: not PEM certificates ({e}); "
                "give the CA that signed the apiserver's client certificate"
            ) from e
        self._client_ca_hash = digest
        log.info("webhook TLS: client CA loaded from %s", self._client_ca_file)

    # -- one pass (all helpers below run under self._lock) -----------------
    async def _pass_locked(self, *, force_ca_rotation: bool) -> bool:
        """True if the pass settled; False if a concurrent writer made it stop early."""
        if self._client_ca_file is not None:
            self._load_client_ca()
        if self._cert_file is not None and self._key_file is not None:
            self._load_locked(self._cert_file.read_bytes(), self._key_file.read_bytes())
            return True
        assert self._client is not None
        now = self._clock()
        secret = await self._read_or_create_locked(self._client, now)
        material = Material.from_secret_data(secret.get("data"))
        configs = await self._read_configs_locked(self._client)
        plan = cert_plan.decide(
            material,
            now=now,
            renew_fraction=self._renew_fraction,
            sans=self._sans,
            trusted=self._settled_trust_locked(configs, now),
            force_ca_rotation=force_ca_rotation,
        )
        if plan.waiting:
            log.info("webhook TLS: %s", plan.waiting)
        if plan.changes:
            log.info("webhook TLS: updating the Secret: %s", "; ".join(plan.reasons))
            material = self._apply(plan, material, now=now)
            secret["data"] = material.secret_data()
            try:
                await self._client.replace(SECRETS, self._secret_name, secret, self._namespace)
            except ApiError as e:
                if not e.conflict:
                    raise
                log.info("webhook TLS: the Secret changed under us; re-reading next pass")
                return False
        if configs and await self._sync_bundles_locked(self._client, configs, material.bundle):
            # Every caBundle holds this bundle from now: its settling time starts.
            synced = self._clock()
            for c in cert_plan.parse_bundle(material.bundle):
                self._trusted_since.setdefault(c.fingerprint, synced)
        assert material.serving is not None
        self.ca_bundle_pem = material.bundle
        self._load_locked(material.serving.cert_pem, material.serving.key_pem)
        return True

    def _settled_trust_locked(
        self, configs: dict[tuple[Resource, str], Any], now: dt.datetime
    ) -> frozenset[str] | None:
        """The CAs every caBundle has held for CABUNDLE_SETTLE (None: no webhook exists)."""
        bundles = [b for cfg in configs.values() for b in cert_plan.webhook_bundles(cfg)]
        everywhere = cert_plan.trusted_everywhere(bundles)
        if everywhere is None:
            self._trusted_since = {}
            return None
        self._trusted_since = {fp: self._trusted_since.get(fp, now) for fp in everywhere}
        return frozenset(fp for fp, t in self._trusted_since.items() if now - t >= CABUNDLE_SETTLE)

    async def _read_or_create_locked(self, client: KubeClient, now: dt.datetime) -> dict[str, Any]:
        try:
            return await client.get(SECRETS, self._secret_name, self._namespace)
        except ApiError as e:
            if not e.not_found:
                raise
        fresh = cert_plan.Plan(rotate_ca=True, issue_serving=True, bundle=())
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {
                "name": self._secret_name,
                "namespace": self._namespace,
                "labels": {"app.kubernetes.io/managed-by": "sandman-webhook"},
            },
            "data": self._apply(fresh, Material(), now=now).secret_data(),
        }
        try:
            created: dict[str, Any] = await client.create(SECRETS, body, self._namespace)
            log.info("webhook TLS: created Secret %s/%s", self._namespace, self._secret_name)
            return created
        except ApiError as e:
            if not e.conflict:
                raise
        # Another replica created it first: adopt its CA rather than fight.
        log.info("webhook TLS: another replica created the Secret; adopting it")
        return await client.get(SECRETS, self._secret_name, self._namespace)

    async def _read_configs_locked(self, client: KubeClient) -> dict[tuple[Resource, str], Any]:
        out: dict[tuple[Resource, str], Any] = {}
        for res, name in self._configs:
            try:
                out[(res, name)] = await client.get(res, name)
            except ApiError as e:
                if not e.not_found:
                    raise
                if (res, name) not in self._missing:  # once per disappearance, not per pass
                    log.warning(
                        "webhook TLS: %s %s not found; caBundle not synced", res.plural, name
                    )
                self._missing.add((res, name))
            else:
                self._missing.discard((res, name))
        return out

    async def _sync_bundles_locked(
        self, client: KubeClient, configs: dict[tuple[Resource, str], Any], bundle: bytes
    ) -> bool:
        """True if every configuration's caBundles now equal ``bundle``."""
        synced = True
        for (res, name), cfg in configs.items():
            ops = cert_plan.ca_bundle_patch(cfg, bundle)
            if not ops:
                continue
            try:
                await client.patch(res, name, ops)
                log.info("webhook TLS: caBundle of %s %s updated", res.plural, name)
            except ApiError as e:
                # 404: deleted since we read it; 422: a `test` failed because the
                # webhook list changed. Either way the next pass re-reads.
                if e.status not in (404, 422):
                    raise
                log.warning("webhook TLS: caBundle of %s %s not updated: %s", res.plural, name, e)
                synced = False
        return synced

    def _load_locked(self, cert_pem: bytes, key_pem: bytes) -> None:
        digest = hashlib.sha256(cert_pem + b"\0" + key_pem).hexdigest()
        if digest == self._loaded_hash:
            return
        not_after = Cert.parse(cert_pem).not_after
        # load_cert_chain reads files only; they exist just for the call, the key 0600.
        self._work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        paths: list[Path] = []
        try:
            paths.append(_write_private(self._work_dir, ".crt", cert_pem))
            paths.append(_write_private(self._work_dir, ".key", key_pem))
            # A pair that does not match (a mounted Secret caught mid-update) must
            # not reach the live context: a failed load there can leave it with the
            # new cert and no key. Try it on a scratch context first.
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(*paths)
            self._ctx.load_cert_chain(*paths)
        finally:
            for p in paths:
                p.unlink(missing_ok=True)
        self._loaded_hash = digest
        self.not_after = not_after
        log.info("webhook TLS: serving cert loaded (expires %s)", not_after.isoformat())
        self.ready.set()


def _write_private(directory: Path, suffix: str, data: bytes) -> Path:
    fd, name = tempfile.mkstemp(dir=directory, prefix="serving-", suffix=suffix)
    with os.fdopen(fd, "wb") as f:  # mkstemp creates the file 0600
        f.write(data)
    return Path(name)
