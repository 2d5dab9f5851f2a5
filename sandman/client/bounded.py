"""Reading a daemon's answer with a bound, and parsing it without trusting it.

A daemon runs inside the sandbox, where the agent may have replaced it: its
answer can be endless (``truncate -s 200G out.json`` and a read of it), or JSON
nested deeper than the parser recurses. Reading stops as soon as an answer
passes its bound, so the trainer never holds more than the bound; a document
that is not JSON, or too deep to parse, is a ProtocolError like any other
broken answer.
"""

from __future__ import annotations

import json
from typing import Any

from sandman.client.errors import ProtocolError, ResponseTooLarge
from sandman.client.transport import DaemonResponse

MiB = 1 << 20
# A JSON answer of the daemon's API: the largest regular ones are an exec
# result at the default 1 MiB per stream (at most ~12 MiB once JSON escapes
# control characters, 6 bytes each, in both streams) and a listing of 10,000
# entries (~3 MiB). 16 MiB is also the daemon's own bound on a JSON request.
MAX_JSON_BYTES = 16 * MiB
# A file or archive read whole into memory (read_file, download_tar): large
# enough for any source tree or log an agent works on; a trainer that runs
# thousands of sandboxes cannot hold many more such answers at once.
MAX_FILE_BYTES = 256 * MiB
# An error answer is a short JSON document; more is not read.
MAX_ERROR_BYTES = 64 * 1024


async def read_bounded(resp: DaemonResponse, limit: int, *, what: str, remedy: str) -> bytes:
    """The whole body of ``resp``, or ResponseTooLarge as soon as it passes
    ``limit`` bytes (a declared Content-Length over it fails before any read);
    the connection is then dropped with the rest unread."""
    declared = resp.content_length
    if declared is not None and declared > limit:
        await resp.close()
        raise ResponseTooLarge(resp.status, limit, what, remedy)
    body = bytearray()
    chunks = resp.chunks()
    try:
        async for chunk in chunks:
            if len(body) + len(chunk) > limit:
                raise ResponseTooLarge(resp.status, limit, what, remedy)
            body += chunk
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]
    return bytes(body)


async def read_prefix(resp: DaemonResponse, limit: int) -> bytes:
    """At most ``limit`` bytes of the body (an error answer's message); the
    rest is dropped unread."""
    body = bytearray()
    chunks = resp.chunks()
    try:
        async for chunk in chunks:
            body += chunk[: limit - len(body)]
            if len(body) >= limit:
                break
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]
    return bytes(body)


def loads(payload: bytes, *, status: int, what: str) -> Any:
    """JSON from a daemon; ProtocolError for anything the parser refuses,
    including nesting past its recursion limit (RecursionError)."""
    try:
        return json.loads(payload)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        kind = "nested too deep" if isinstance(e, RecursionError) else f"not JSON ({e})"
        raise ProtocolError(status, f"{what}: the daemon's answer is {kind}") from None
