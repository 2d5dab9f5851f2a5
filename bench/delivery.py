"""The daemon's delivery for a benchmark's namespace (copy, shared or node).

The cluster's policy decides the delivery per namespace; a benchmark that
compares deliveries prepends a rule of its own for the run (restored after)
and labels its namespace to match, then waits until the webhooks enforce it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

from sandman.client import SandmanClient
from sandman.client.sandbox import build_pod
from sandman.contract import LABEL_NODE_KIND
from sandman.harness.cluster.local import LocalCluster
from sandman.harness.testing import policy_rule
from sandman.kube_async import PODS, ApiError
from sandman.webhook.mutate import DELIVERIES, delivery_of

POLICY_LABEL = "sandman.dev/policy-test"
RULE_PREFIX = "bench-delivery-"  # + the delivery: the policy rule of its namespaces


def deliveries(value: str, flag: str = "--delivery") -> list[str]:
    """``flag``'s value (one delivery or a comma list), checked before any
    cluster is brought up for nothing."""
    out = value.split(",")
    for d in out:
        if d not in DELIVERIES:
            raise SystemExit(f"{flag}: one of {', '.join(DELIVERIES)}, not {d!r}")
    return out


@contextlib.contextmanager
def delivery_policy(cluster: LocalCluster, delivery: str) -> Iterator[dict[str, str]]:
    """Namespace labels that get ``delivery`` (a prepended policy rule for
    shared and node; copy is the cluster's default)."""
    deliveries(delivery)
    if delivery == "copy":
        yield {}
        return
    rule = f"{RULE_PREFIX}{delivery}"
    with policy_rule(cluster, rule, {POLICY_LABEL: rule}, daemonDelivery=delivery):
        yield {POLICY_LABEL: rule}


async def wait_delivery(client: SandmanClient, image: str, delivery: str) -> None:
    """Until a dry-run sandbox in the client's namespace gets ``delivery``
    (the webhooks reload the policy on their own schedule)."""
    body = build_pod(image, name="probe", command=["sleep", "infinity"], env={}, resources=None,
                     ttl=None, idle_timeout=None, profile=None, workspace=None, labels={},
                     annotations={}, node_selector={LABEL_NODE_KIND: "real"},
                     tolerations=None)  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        try:
            got = await client.kube.create(PODS, body, client.namespace, dry_run="All")
        except ApiError as e:
            if e.status < 500 or time.monotonic() > deadline:
                raise
            got = {"spec": {}}  # the webhook is down or slow: ask again
        if got["spec"] and delivery_of(got) == delivery:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the webhook never chose the {delivery} delivery")
        await asyncio.sleep(1)
