"""kube-scheduler's extender protocol: ExtenderArgs in, HostPriorityList out (no I/O).

The types are k8s.io/kube-scheduler/extender/v1 (types.go), encoded by Go's
encoding/json without tags, so the field names are the Go names, capitalised:

    ExtenderArgs         {"Pod": v1.Pod, "Nodes": v1.NodeList | null,
                          "NodeNames": [string] | null}
    HostPriorityList     [{"Host": string, "Score": int64}]   0 <= Score <= 10

With ``nodeCacheCapable: true`` the scheduler sends ``NodeNames`` and leaves
``Nodes`` null; both are read here so that a configuration without it still
works. Go decodes case-insensitively, but we answer with the exact names.

The server moves bytes; this module decides. Tests call it with dicts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any

from sandman.extender.index import ImageIndex, PodFacts
from sandman.extender.observe import pod_requests
from sandman.extender.score import Ranking, ScoreParams, prioritize


class ArgsError(ValueError):
    """The body is not an ExtenderArgs; answered with HTTP 400 (the scheduler ignores us)."""


@dataclass(frozen=True)
class ExtenderArgs:
    pod: dict[str, Any]
    node_names: tuple[str, ...]

    @property
    def uid(self) -> str:
        return str((self.pod.get("metadata") or {}).get("uid") or "")


def parse_args(doc: Any) -> ExtenderArgs:
    if not isinstance(doc, dict):
        raise ArgsError("ExtenderArgs must be a JSON object")
    pod = doc.get("Pod")
    if not isinstance(pod, dict):
        raise ArgsError("ExtenderArgs.Pod is missing")
    names = doc.get("NodeNames")
    if names is None:
        nodes = doc.get("Nodes") or {}
        items = (nodes.get("items") or []) if isinstance(nodes, dict) else []
        names = [((n.get("metadata") or {}).get("name")) for n in items if isinstance(n, dict)]
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ArgsError("ExtenderArgs.NodeNames must be a list of node names")
    return ExtenderArgs(pod, tuple(names))


@dataclass(frozen=True)
class Prioritized:
    ranking: Ranking
    facts: PodFacts

    def body(self) -> bytes:
        return host_priority_list(self.ranking.scores)


def host_priority_list(scores: Sequence[tuple[str, int]]) -> bytes:
    """The HostPriorityList JSON, built with the C string encoder: at 5,000 nodes
    ``json.dumps`` of a list of dicts costs several times more."""
    quote = encode_basestring_ascii
    return (
        "[" + ",".join(f'{{"Host":{quote(h)},"Score":{int(s)}}}' for h, s in scores) + "]"
    ).encode()


def prioritize_pod(index: ImageIndex, args: ExtenderArgs, params: ScoreParams) -> Prioritized:
    """Score every candidate node and record where the pod will most likely go.

    The record (``ImageIndex.assume``) is what lets the next pod of the same
    image, scheduled milliseconds later, see this one before its binding
    reaches us through the watch.
    """
    refs = pod_requests(args.pod)
    facts = index.pod_facts(refs, args.node_names)
    ranking = prioritize(
        facts.total, facts.facts, args.node_names, facts.primary, params, facts.default
    )
    if ranking.winner is not None and args.uid and not index.knows_pod(args.uid):
        index.assume(args.uid, ranking.winner, refs)
    return Prioritized(ranking, facts)


def where_body(index: ImageIndex, image: str) -> dict[str, Any] | None:
    """The /v1/images answer: which nodes hold or are pulling ``image``."""
    w = index.where(image)
    if w is None:
        return None
    return {
        "image": image,
        "key": w.key,
        "sizeBytes": w.size,
        "holders": [{"node": n, "evidence": list(ev)} for n, ev in w.holders.items()],
        "pulling": [{"node": n, "pods": c} for n, c in w.pulling.items()],
    }
