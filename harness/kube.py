"""Kubernetes client setup shared by every component (written once)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config


def api_client(kubeconfig: Path | str | None = None) -> client.ApiClient:
    """A client from a kubeconfig file, or the in-cluster service account."""
    if kubeconfig is None:
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)
        return client.ApiClient(cfg)
    return config.new_client_from_config(config_file=str(kubeconfig))


def raw(resp: Any) -> Any:
    """Decode a ``_preload_content=False`` response into plain JSON data.

    Plain dicts keep field names exactly as on the wire, which is what the
    contract code reads and what JSON patches address.
    """
    return json.loads(resp.data)


def started_since(pod: dict[str, Any], since: datetime) -> bool:
    """Whether every container of ``pod`` (plain JSON) is running and started at
    or after ``since`` (an aware datetime). After a node restart, a pod's status
    stays the one from before (Ready included) until its kubelet reports again:
    a start time after the restart is what tells a fresh status from a stale one."""
    want = len((pod.get("spec") or {}).get("containers") or [])
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    if want == 0 or len(statuses) < want:
        return False
    floor = since.replace(microsecond=0)  # the API's timestamps have whole seconds
    for s in statuses:
        started = ((s.get("state") or {}).get("running") or {}).get("startedAt")
        if not started or datetime.fromisoformat(started) < floor:
            return False
    return True
