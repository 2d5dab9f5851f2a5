"""The apiserver's count of lease extensions it refused for want of the webhook (pure).

When the apiserver cannot call a ``failurePolicy: Fail`` webhook (refused,
timed out, bad certificate), it refuses the request and counts it:
``apiserver_admission_webhook_rejection_count{name, type, operation,
error_type="calling_webhook_error", rejection_code}`` (k8s.io/apiserver
``pkg/admission/metrics``; ALPHA stability, present since 1.16). Only
``type="validating"`` UPDATEs of the named webhook are counted: a lease
extension is an UPDATE, and pod CREATEs refused while a fresh install starts
are not extensions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

METRIC = "apiserver_admission_webhook_rejection_count"
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def labels(text: str) -> dict[str, str]:
    return {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(text)}


def call_failures(lines: Iterable[str], webhook: str) -> float:
    """The apiserver's count of UPDATEs refused because it could not call ``webhook``."""
    total = 0.0
    prefix = METRIC + "{"
    for line in lines:
        if not line.startswith(prefix):
            continue
        head, _, rest = line[len(prefix) :].partition("}")
        got = labels(head)
        if (
            got.get("name") == webhook
            and got.get("type") == "validating"
            and got.get("operation") == "UPDATE"
            and got.get("error_type") == "calling_webhook_error"
        ):
            try:
                total += float(rest.split()[0])
            except (IndexError, ValueError):
                continue  # not a sample line: nothing to add
    return total


def rose(previous: float | None, current: float) -> bool:
    """Whether failures happened between two readings.

    The first reading is the baseline (what came before the reaper is not
    its to judge). A count that went down is another apiserver instance, or
    one that restarted: a new baseline, not a failure. Behind a load balancer
    over several apiservers a reading can also go up by switching instances:
    that holds leases for one grace, the safe direction.
    """
    return previous is not None and current > previous
