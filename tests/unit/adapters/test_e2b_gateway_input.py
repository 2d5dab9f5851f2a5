"""The E2B gateway's own inputs: its key, and lease timeouts from clients."""

from __future__ import annotations

from typing import Any

import pytest

from sandman.adapters.e2b.api import MAX_TIMEOUT_S, ApiFailure, _timeout
from sandman.adapters.e2b.gateway import Gateway, GatewayConfig


def test_an_empty_key_is_refused() -> None:
    """With an empty key every request without X-API-KEY would pass."""
    with pytest.raises(ValueError, match="key"):
        Gateway(GatewayConfig(namespace="ns", api_key=""), client=None)  # type: ignore[arg-type]
    gw = Gateway(GatewayConfig(namespace="ns", api_key="k"), client=None)  # type: ignore[arg-type]
    assert not gw.api_key_ok({}) and gw.api_key_ok({"X-API-KEY": "k"})


@pytest.mark.parametrize("value", [0, -1, True, "60", 1.5, MAX_TIMEOUT_S + 1, 10**20])
def test_timeouts_out_of_range_are_a_400(value: Any) -> None:
    with pytest.raises(ApiFailure) as e:
        _timeout({"timeout": value}, None)
    assert e.value.status == 400


def test_timeouts_in_range_pass() -> None:
    assert _timeout({}, 300) == 300 and _timeout({"timeout": MAX_TIMEOUT_S}, None) == MAX_TIMEOUT_S


def test_metadata_annotation_nested_too_deep_is_no_metadata() -> None:
    """The metadata annotation is editable by anyone who may patch the pod: a
    document nested past the JSON parser's depth lists as no metadata, not a
    500 for every Sandbox.list()."""
    from sandman.adapters.e2b.api import _detail
    from sandman.contract import ANN_E2B_METADATA

    gw = Gateway(GatewayConfig(namespace="ns", api_key="k"), client=None)  # type: ignore[arg-type]
    pod = {"metadata": {"name": "sb", "annotations": {ANN_E2B_METADATA: "[" * 100_000}}}
    assert _detail(gw, pod, with_token=False)["metadata"] == {}
