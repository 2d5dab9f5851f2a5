"""An aiohttp connector that connects only where ``sandman.netguard`` allows.

The check sits in the resolver, so it sees the addresses the connection is
then made to: a name that resolved to a public address a moment ago and
resolves to 127.0.0.1 now (DNS rebinding) is refused when it matters.
aiohttp hands IP literals to no resolver; the registry client checks those
itself before each request (``RegistryClient._checked``).
"""

from __future__ import annotations

import socket

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from sandman.netguard import AddressRule


class RefusedAddressError(OSError):
    """Every address a name resolved to is refused by the rule; says which classes."""


class GuardedResolver(AbstractResolver):
    """DNS answers with the refused addresses taken out.

    Exists so that a pod author who names a registry host cannot make the
    webhook connect to loopback, the node, the cluster or link-local
    metadata by pointing that name there. Stateless besides the inner
    resolver; safe for concurrent use in one event loop."""

    def __init__(self, rule: AddressRule, inner: AbstractResolver | None = None) -> None:
        self.rule = rule
        self._inner = inner or DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        refused = {r["host"]: self.rule.refusal(host, port, r["host"]) for r in found}
        ok = [r for r in found if refused[r["host"]] is None]
        if not ok:
            classes = sorted({why for why in refused.values() if why})
            raise RefusedAddressError(
                f"{host}:{port} resolves only to refused addresses ({', '.join(classes)})"
            )
        return ok

    async def close(self) -> None:
        await self._inner.close()


def guarded_connector(
    rule: AddressRule, *, limit: int, limit_per_host: int
) -> aiohttp.TCPConnector:
    """A connector for a client session whose every connection passes ``rule``.

    The DNS cache holds answers after filtering, so a cached answer is as
    checked as a fresh one (the rule does not change for a connector)."""
    return aiohttp.TCPConnector(
        resolver=GuardedResolver(rule), limit=limit, limit_per_host=limit_per_host
    )
