"""Which labeled pods the reaper may act on at all (pure: a pod and the keys in).

A label is something anyone who can create pods can write. Before acting
(deleting, polling) the reaper requires what only the webhook can produce:
``sandman.dev/admitted``, an HMAC over the pod's namespace, sandbox id and key
generation with a key derived from the cluster key (``sandman.tokens``). So a
pod that got the label some other way (a namespace the webhook skips, a
forged marker, a copy) is left alone, and nothing in a system namespace is
ever touched, whatever its labels.
"""

from __future__ import annotations

import enum
from typing import Any

from sandman.contract import (
    ANN_ADMITTED,
    ANN_KEY_ID,
    LABEL_ID,
    SYSTEM_NAMESPACES,
    annotations,
    labels,
)
from sandman.tokens import LEGACY_KEY_ID, AdmissionKeys


class Trust(enum.Enum):
    ADMITTED = "admitted"  # the webhook's marker verifies: act on it
    RETIRED = "retired"  # verifies, under a key generation since retired: reclaim it
    UNVERIFIED = "unverified"  # no valid marker: never act, report once
    SYSTEM = "system"  # a system namespace: never act, never report


def trust(pod: dict[str, Any], keys: AdmissionKeys | None) -> Trust:
    md = pod.get("metadata") or {}
    if md.get("namespace") in SYSTEM_NAMESPACES:
        return Trust.SYSTEM
    if keys is None:
        return Trust.UNVERIFIED  # keys not read yet: decided again once they are
    ann = annotations(pod)
    kid = ann.get(ANN_KEY_ID) or LEGACY_KEY_ID
    ok = keys.verify(
        str(md.get("namespace", "")),
        str(labels(pod).get(LABEL_ID, "")),
        str(kid),
        str(ann.get(ANN_ADMITTED, "")),
    )
    if not ok:
        return Trust.UNVERIFIED
    return Trust.RETIRED if kid in keys.retired else Trust.ADMITTED
