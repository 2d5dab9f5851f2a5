"""The informer's cache: pages of a relist, what it keeps, deletions across a relist."""

from __future__ import annotations

from typing import Any

from sandman.informer import Informer
from sandman.kube_async import PODS


def pod(name: str, rv: str = "1") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "n", "uid": f"u-{name}", "resourceVersion": rv},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }


class Pages:
    """A stand-in apiserver list: the given pages, joined by continue tokens."""

    def __init__(self, *pages: list[dict[str, Any]]) -> None:
        self.pages = list(pages)
        self.calls: list[dict[str, Any]] = []

    async def list(self, res: Any, namespace: Any = None, **params: Any) -> dict[str, Any]:
        self.calls.append(params)
        i = int(params.get("continue_") or 0)
        md: dict[str, Any] = {"resourceVersion": "42"}
        if i + 1 < len(self.pages):
            md["continue"] = str(i + 1)
        return {"items": self.pages[i], "metadata": md}


def slim(o: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": o["metadata"]["name"], "namespace": "n", "uid": "x"}}


async def test_a_relist_keeps_only_the_view_and_hands_whole_objects_to_the_handler() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []
    client = Pages([pod("a"), pod("b")], [pod("c")])
    inf = Informer(client, PODS, lambda k, o: seen.append((k, o)), keep=slim)  # type: ignore[arg-type]
    await inf._relist()
    # Two pages, continued: the second asked with the first's token.
    assert [c.get("continue_") for c in client.calls] == [None, "1"]
    assert inf.store == {f"n/{x}": slim(pod(x)) for x in "abc"}
    assert [(k, o["metadata"]["name"], "spec" in o) for k, o in seen] == [
        ("ADDED", "a", True),
        ("ADDED", "b", True),
        ("ADDED", "c", True),
    ]
    assert inf.resource_version == "42" and inf.synced.is_set()


async def test_what_vanished_between_relists_is_reported_deleted_from_the_cache() -> None:
    seen: list[tuple[str, str]] = []
    client = Pages([pod("a"), pod("b")])
    inf = Informer(client, PODS, lambda k, o: seen.append((k, o["metadata"]["name"])), keep=slim)  # type: ignore[arg-type]
    await inf._relist()
    client.pages = [[pod("b", "2")], [pod("d")]]
    seen.clear()
    await inf._relist()
    # b and d are (re)added; a vanished: its deletion carries the cached view,
    # all that is left of it (name, namespace, uid).
    assert sorted(seen) == [("ADDED", "b"), ("ADDED", "d"), ("DELETED", "a")]
    assert set(inf.store) == {"n/b", "n/d"}


async def test_without_keep_the_cache_holds_whole_objects() -> None:
    inf = Informer(Pages([pod("a")]), PODS)  # type: ignore[arg-type]
    await inf._relist()
    assert inf.store["n/a"] == pod("a")
