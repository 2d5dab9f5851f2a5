"""What the index has learned about image names: sizes and tag -> digest (pure, bounded).

A node's ``status.images`` entry lists several names of one image (its repo
digest, then its tags) and its size; a started container's ``imageID`` says
which digest a tag ran as. From both we learn, per name, the size and, for a
tag, the content digest it stands for, so that a pod naming ``repo:v1`` finds
a node that lists only ``repo@sha256:...``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from sandman.extender.refs import ImageRef


@dataclass
class _Meta:
    size: int | None = None
    digest: str | None = None  # learned content digest of a tag key


class ImageNames:
    """Sizes and learned digests per normalised name, least recently reported first out.

    Failure modes it bounds: growth without end (a cluster cycling through
    new task images forever) by evicting the least recently reported name,
    which then falls back to the default size until a node reports it again;
    and a moved tag, where the last writer wins (a tag re-pushed to a new
    digest is learned again from the next node or container that shows it).

    Not safe for concurrent use (the index's event loop owns it).
    """

    def __init__(self, max_names: int) -> None:
        self._max = max_names
        self._meta: OrderedDict[str, _Meta] = OrderedDict()

    def __len__(self) -> int:
        return len(self._meta)

    def learn(self, key: str, *, size: int | None = None, digest: str | None = None) -> None:
        meta = self._meta.get(key)
        if meta is None:
            meta = self._meta[key] = _Meta()
            if len(self._meta) > self._max:
                self._meta.popitem(last=False)
        else:
            self._meta.move_to_end(key)
        if size:
            meta.size = size
        if digest:
            meta.digest = digest

    def size(self, key: str) -> int | None:
        meta = self._meta.get(key)
        return meta.size if meta is not None and meta.size else None

    def digest(self, ref: ImageRef) -> str | None:
        """The content digest ``ref`` names or is known to stand for."""
        if ref.digest:
            return ref.digest
        meta = self._meta.get(ref.key)
        return meta.digest if meta else None

    def lookup_keys(self, ref: ImageRef) -> tuple[str, ...]:
        """Keys under which a node holding ``ref`` may be listed."""
        digest = self.digest(ref)
        return (ref.key, f"@{digest}") if digest else (ref.key,)

    def idents(self, ref: ImageRef) -> tuple[str, ...]:
        """The identities a pending pull of ``ref`` may be recorded under."""
        digest = self.digest(ref)
        if ref.digest or not digest:
            return (ref.ident,)
        return (ref.ident, f"@{digest}")

    def size_of(self, ref: ImageRef) -> int | None:
        for k in self.lookup_keys(ref):
            if (size := self.size(k)) is not None:
                return size
        return None

    @staticmethod
    def index_keys(ref: ImageRef) -> tuple[str, ...]:
        """Keys a holder of ``ref`` is listed under: the name, and the bare content."""
        return (ref.key, ref.content_key) if ref.content_key else (ref.key,)
