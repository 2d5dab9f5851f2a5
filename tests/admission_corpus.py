"""The admission corpus (tests/corpus/admission/*.yaml): loading cases and judging outcomes.

Shared by the pure runner (tests/unit/webhook/test_corpus_admission.py) and the
apiserver runner (tests/integration/test_admission_corpus.py), so both read a
case the same way. The format is in tests/corpus/README.md.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sandman.contract import LABEL_SANDBOX
from sandman.harness.cluster.deploy import LOCAL_POLICY

CORPUS = Path(__file__).resolve().parent / "corpus" / "admission"
IMAGE = "127.0.0.1:5000/sandman/tiny:1"
BASE_POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"generateName": "corpus-", "labels": {LABEL_SANDBOX: "true"}},
    "spec": {"containers": [{"name": "main", "image": IMAGE, "command": ["sleep", "3600"]}]},
}
CONTROLLERS = ("Deployment", "ReplicaSet", "Job", "CronJob", "StatefulSet", "DaemonSet")
RULE_IN_MESSAGE = re.compile(r"\[([a-z-]+)\]")


def merge(base: Any, over: Any) -> Any:
    """Deep merge of mappings (RFC 7386-like: lists and scalars replace, null deletes)."""
    if not isinstance(base, dict) or not isinstance(over, dict):
        return copy.deepcopy(over)
    out = copy.deepcopy(base)
    for k, v in over.items():
        if v is None and k in out:
            del out[k]
        else:
            out[k] = merge(out.get(k), v)
    return out


@dataclass
class Case:
    file: str
    name: str
    pod: dict[str, Any]  # the pod (for a controller: the pod its template makes)
    expect: dict[str, Any]
    policy: str
    namespace_labels: dict[str, str]
    controller: str | None = None  # kind of the controller whose template is the pod
    update: list[dict[str, Any]] | None = None  # JSON patch on the admitted pod
    subresource: str = ""
    apiserver: bool = False
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.file}: {self.name}"


def _pod(doc: dict[str, Any], case: dict[str, Any]) -> dict[str, Any]:
    if "raw_pod" in case:
        return json.loads(case["raw_pod"])  # duplicated keys: the last wins, as in the apiserver
    if "pod" in case:
        return merge(BASE_POD, case["pod"]) if case.get("pod_merge", True) else case["pod"]
    pod = copy.deepcopy(BASE_POD)
    pod = merge(pod, {"metadata": case.get("metadata") or {}})
    pod["spec"] = merge(pod["spec"], case.get("spec") or {})
    if "container" in case:
        pod["spec"]["containers"][0] = merge(pod["spec"]["containers"][0], case["container"])
    return pod


def load() -> list[Case]:
    out = []
    for path in sorted(CORPUS.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        for c in doc["cases"]:
            expect = c["expect"]
            assert ("denied" in expect) != ("allowed" in expect), (path.stem, c["name"])
            out.append(
                Case(
                    file=path.stem,
                    name=c["name"],
                    pod=_pod(doc, c),
                    expect=expect,
                    policy=doc.get("policy") or LOCAL_POLICY,
                    namespace_labels=doc.get("namespace_labels") or {},
                    controller=c.get("controller"),
                    update=c.get("update"),
                    subresource=c.get("subresource", ""),
                    apiserver=bool(c.get("apiserver", doc.get("apiserver", False))),
                    raw=c,
                )
            )
    return out


def pointer(doc: Any, path: str) -> Any:
    """The value at a JSON pointer, or KeyError."""
    for part in path.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def check_pod(case: Case, pod: dict[str, Any]) -> None:
    """The allowed pod has the properties the case lists."""
    exp = case.expect
    for path, want in (exp.get("pod") or {}).items():
        try:
            got = pointer(pod, path)
        except (KeyError, IndexError):
            got = None
        assert got == want, f"{case.id}: {path} is {got!r}, want {want!r}"
    for path, unwanted in (exp.get("pod_not") or {}).items():
        try:
            got = pointer(pod, path)
        except (KeyError, IndexError):
            continue
        assert got != unwanted, f"{case.id}: {path} is still {got!r}"
    for path, items in (exp.get("pod_contains") or {}).items():
        got = pointer(pod, path)
        missing = [i for i in items if i not in got]
        assert not missing, f"{case.id}: {path} lacks {missing} (has {got!r})"
    for what, n in (exp.get("pod_count") or {}).items():
        # "/spec/initContainers name=sandman-install": how many items have name=...
        path, _, match = what.partition(" ")
        key, _, value = match.partition("=")
        got = sum(1 for i in pointer(pod, path) or [] if i.get(key) == value)
        assert got == n, f"{case.id}: {n} x {what} expected, found {got}"


def rules_in(message: str) -> set[str]:
    return set(RULE_IN_MESSAGE.findall(message))
