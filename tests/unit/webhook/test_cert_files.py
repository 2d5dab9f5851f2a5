"""File mode: mounted certs are hot-reloaded into the live server's SSL context."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from pathlib import Path

import pytest
from aiohttp import web
from cryptography import x509

from sandman import tls
from sandman.harness.probes import insecure_context
from sandman.webhook.certs import CertManager

NOW = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)  # pinned: the test client checks no dates
HOUR = dt.timedelta(hours=1)


def write_pair(tmp: Path, ca: tls.KeyPair) -> int:
    """A fresh serving cert in tls.crt/tls.key; returns its serial."""
    kp = tls.issue(ca, "127.0.0.1", now=NOW, valid_for=HOUR, ips=["127.0.0.1"], server=True)
    (tmp / "tls.crt").write_bytes(kp.cert_pem)
    (tmp / "tls.key").write_bytes(kp.key_pem)
    return kp.cert.serial_number


async def served_serial(port: int) -> int:
    """Handshake with the server and return the serial of the certificate it presented."""
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=insecure_context())
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    return x509.load_der_x509_certificate(der).serial_number


def manager(tmp_path: Path) -> CertManager:
    return CertManager(
        None,
        namespace="unused",
        secret_name="unused",
        dns_names=(),
        ip_addresses=("127.0.0.1",),
        ca_validity=HOUR,
        cert_validity=HOUR,
        cert_file=tmp_path / "tls.crt",
        key_file=tmp_path / "tls.key",
        work_dir=tmp_path / "work",
    )


async def serve(certs: CertManager) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(web.Application())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=certs.ssl_context())
    await site.start()
    port = runner.addresses[0][1]
    return runner, port


async def test_rotated_files_are_served_without_restarting_the_site(tmp_path: Path) -> None:
    ca = tls.new_ca("files-ca", now=NOW, valid_for=HOUR)
    first = write_pair(tmp_path, ca)
    certs = manager(tmp_path)
    assert not certs.ready.is_set()
    await certs.reconcile()
    assert certs.ready.is_set()
    runner, port = await serve(certs)
    try:
        assert await served_serial(port) == first
        second = write_pair(tmp_path, ca)
        assert second != first
        await certs.reconcile()
        assert await served_serial(port) == second
        served = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
        assert certs.not_after == served.not_valid_after_utc
        # No PEM (and no key) is left behind in the work dir.
        assert list((tmp_path / "work").iterdir()) == []
    finally:
        await runner.cleanup()


async def test_a_mismatched_pair_keeps_the_old_cert_served(tmp_path: Path) -> None:
    # A mounted Secret caught between updates: the new cert with the old key.
    ca = tls.new_ca("files-ca", now=NOW, valid_for=HOUR)
    first = write_pair(tmp_path, ca)
    certs = manager(tmp_path)
    await certs.reconcile()
    runner, port = await serve(certs)
    try:
        old_key = (tmp_path / "tls.key").read_bytes()
        write_pair(tmp_path, ca)
        (tmp_path / "tls.key").write_bytes(old_key)
        with pytest.raises(ssl.SSLError):
            await certs.reconcile()
        assert await served_serial(port) == first
        # Once the key catches up, the next pass loads the pair.
        third = write_pair(tmp_path, ca)
        await certs.reconcile()
        assert await served_serial(port) == third
    finally:
        await runner.cleanup()


async def test_run_logs_failures_and_keeps_going_until_stopped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    certs = manager(tmp_path)  # no files yet: every pass fails
    stop = asyncio.Event()
    task = asyncio.create_task(certs.run(stop, interval_s=0.01))
    await asyncio.sleep(0.05)
    assert not task.done() and not certs.ready.is_set()
    assert "webhook TLS pass failed" in caplog.text
    write_pair(tmp_path, tls.new_ca("files-ca", now=NOW, valid_for=HOUR))
    await asyncio.wait_for(certs.ready.wait(), 5)
    stop.set()
    await asyncio.wait_for(task, 5)
