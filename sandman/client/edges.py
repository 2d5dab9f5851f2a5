"""Where the SDK meets its libraries: their exceptions become the SDK's.

A trainer catches ``SandmanError`` (and its subclasses) and nothing else: an
``aiohttp.ClientConnectorError`` from an apiserver that went away, a
``ServerDisconnectedError`` mid-answer or asyncio's ``TimeoutError`` must not
reach it raw, or one ``except SandmanError`` no longer covers the SDK. Each is
translated here, the original kept as ``__cause__`` for the traceback.
Exceptions that are not the libraries' (a ValueError for a bad argument, a
cancellation) pass through untouched.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import aiohttp

from sandman.client.errors import (
    ConfigError,
    KubernetesError,
    SandboxGone,
    SandmanError,
    TransportError,
)
from sandman.kube_async import ApiError, KubeconfigError, WatchExpired
from sandman.tokens import KeyRetired, KeySecretError

F = TypeVar("F", bound=Callable[..., Any])


def translate(e: BaseException, what: str) -> BaseException:
    """The SDK's error for ``e``, raised while doing ``what``; ``e`` itself
    when it is the SDK's already or not a library's failure.

    >>> type(translate(ApiError(403, {"message": "forbidden"}), "get pod")).__name__
    'KubernetesError'
    >>> str(translate(TimeoutError(), "POST /v1/exec"))
    'POST /v1/exec: timed out (TimeoutError)'
    >>> e = ValueError("bad ttl"); translate(e, "extend") is e
    True
    """
    if isinstance(e, SandmanError):
        return e
    if isinstance(e, ApiError):
        return KubernetesError(e.status, e.body)
    if isinstance(e, KubeconfigError):
        return ConfigError(str(e))
    if isinstance(e, KeyRetired):  # the reaper reclaims such sandboxes
        return SandboxGone(f"{what}: {e}; create a new sandbox")
    if isinstance(e, KeySecretError):
        return ConfigError(f"{what}: the namespace's sandman-access Secret: {e}")
    if isinstance(e, WatchExpired):
        return TransportError(f"{what}: the watch expired (410 Gone)")
    if isinstance(e, TimeoutError):  # asyncio's and the builtin are one class on 3.11
        return TransportError(f"{what}: timed out ({type(e).__name__})")
    if isinstance(e, aiohttp.ClientError | OSError):
        return TransportError(f"{what}: {e or type(e).__name__}")
    if isinstance(e, json.JSONDecodeError):
        # A 2xx that is not JSON: a proxy or load balancer on the way answered.
        return TransportError(f"{what}: the apiserver's answer is not JSON ({e})")
    return e


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Raise the SDK's error for whatever a library raises inside."""
    try:
        yield
    except asyncio.CancelledError:
        raise
    except Exception as e:
        err = translate(e, what)
        if err is e:
            raise
        raise err from e


def sdk_errors(what: str) -> Callable[[F], F]:
    """Decorate an SDK coroutine method (or async generator) so that only the
    SDK's errors leave it."""

    def wrap(fn: F) -> F:
        if inspect.isasyncgenfunction(fn):

            @functools.wraps(fn)
            async def gen(*args: Any, **kwargs: Any) -> Any:
                with translated(what):
                    async for item in fn(*args, **kwargs):
                        yield item

            return gen  # type: ignore[return-value]

        @functools.wraps(fn)
        async def call(*args: Any, **kwargs: Any) -> Any:
            with translated(what):
                return await fn(*args, **kwargs)

        return call  # type: ignore[return-value]

    return wrap
