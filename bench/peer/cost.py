"""What a sandbox lifecycle costs the control plane, read from the control plane itself.

- apiserver requests by verb and resource: ``apiserver_request_total`` from the
  apiserver's /metrics before and after a phase (non-resource requests, such as
  these scrapes, are left out; so are the bench's own polls, counted by the
  observer client and subtracted);
- CPU-seconds of the apiserver, etcd, the controller-manager and scheduler, and
  of each system's controllers, from /proc;
- objects and bytes stored in etcd, read through etcd's JSON gateway while a
  phase's sandboxes all exist.
"""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sandman.bench.scale_metrics import cpu_seconds, parse_prometheus
from sandman.kube_async import KubeClient

Pids = Callable[[], Mapping[str, list[int]]]  # role -> its processes now


async def apiserver_counts(kube: KubeClient) -> dict[tuple[str, str], float]:
    """(verb, resource) -> requests so far."""
    sess = kube.session()
    async with sess.get(
        kube.creds.server + "/metrics", headers=await kube.auth_headers(), **kube.request_options()
    ) as resp:
        text = await resp.text()
    sample = parse_prometheus(text, ("apiserver_request_total",))
    out: dict[tuple[str, str], float] = {}
    for (name, labels), v in sample.items():
        if name != "apiserver_request_total":
            continue
        lab = dict(labels)
        resource = lab.get("resource", "")
        if not resource:
            continue
        sub = lab.get("subresource", "")
        key = (lab.get("verb", ""), resource + (f"/{sub}" if sub else ""))
        out[key] = out.get(key, 0.0) + v
    return out


def counts_delta(
    after: Mapping[tuple[str, str], float], before: Mapping[tuple[str, str], float]
) -> dict[tuple[str, str], float]:
    """Per (verb, resource) difference, only the ones that moved."""
    out = {}
    for k, v in after.items():
        d = v - before.get(k, 0.0)
        if d > 0:
            out[k] = d
    return out


def cpu_by_role(pids: Mapping[str, list[int]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for role, ps in pids.items():
        out[role] = sum(c for c in (cpu_seconds(p) for p in ps) if c is not None)
    return out


def etcd_usage(port: int, prefix: str = "/registry/") -> tuple[int, int]:
    """(objects, bytes of keys and values) under ``prefix`` in etcd."""
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    body = {
        "key": base64.b64encode(prefix.encode()).decode(),
        "range_end": base64.b64encode(end.encode()).decode(),
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v3/kv/range", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        kvs = json.loads(r.read()).get("kvs") or []
    size = sum(
        len(base64.b64decode(kv.get("key", ""))) + len(base64.b64decode(kv.get("value", "")))
        for kv in kvs
    )
    return len(kvs), size


@dataclass
class Ledger:
    """One system's costs summed over its phases."""

    sandboxes: int = 0
    requests: dict[tuple[str, str], float] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)
    etcd_objects: int = 0
    etcd_bytes: int = 0
    bench_polls: float = 0.0  # the bench's own waiting lists, in ``requests``

    def add_requests(self, d: Mapping[tuple[str, str], float]) -> None:
        for k, v in d.items():
            self.requests[k] = self.requests.get(k, 0.0) + v

    def add_cpu(self, d: Mapping[str, float]) -> None:
        for k, v in d.items():
            self.cpu_s[k] = self.cpu_s.get(k, 0.0) + v

    def per_sandbox(self) -> dict[str, object]:
        n = max(1, self.sandboxes)
        by = {f"{verb} {res}": round(v / n, 2) for (verb, res), v in sorted(self.requests.items())}
        cpu = {k: round(v / n, 4) for k, v in sorted(self.cpu_s.items())}
        return {
            "sandboxes": self.sandboxes,
            "apiserver_requests": round((sum(self.requests.values()) - self.bench_polls) / n, 2),
            "bench_polls_subtracted": round(self.bench_polls / n, 2),
            "apiserver_requests_by_verb_resource": by,
            "cpu_s": cpu,
            "etcd_objects": round(self.etcd_objects / n, 2),
            "etcd_bytes": round(self.etcd_bytes / n),
        }


def cpu_delta(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    return {k: max(0.0, v - before.get(k, 0.0)) for k, v in after.items()}
