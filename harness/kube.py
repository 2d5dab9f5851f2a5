"""Kubernetes client setup shared by every component (written once)."""

from __future__ import annotations

import json
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
