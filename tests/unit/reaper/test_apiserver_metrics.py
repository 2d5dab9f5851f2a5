"""The apiserver's count of extensions refused for want of the webhook, read from /metrics."""

from __future__ import annotations

import pytest

from sandman.reaper.apiserver_metrics import call_failures, labels, rose

M = "apiserver_admission_webhook_rejection_count"


def sample(value: int, name: str = "policy.sandman.dev", **over: str) -> str:
    got = {
        "error_type": "calling_webhook_error",
        "name": name,
        "operation": "UPDATE",
        "rejection_code": "500",
        "type": "validating",
        **over,
    }
    return M + "{" + ",".join(f'{k}="{v}"' for k, v in got.items()) + "}" + f" {value}"


TEXT = [
    f"# HELP {M} Admission webhook rejection count",
    f"# TYPE {M} counter",
    sample(3),
    sample(2, rejection_code="400"),
    sample(7, operation="CREATE"),
    sample(11, error_type="no_error", rejection_code="403"),
    sample(13, name="other.example"),
    sample(17, type="admit"),
    'apiserver_admission_webhook_request_total{name="policy.sandman.dev"} 19',
]


def test_only_validating_updates_the_apiserver_could_not_send_count() -> None:
    # 3 + 2 (UPDATE, calling_webhook_error, validating, our name); not the
    # CREATE (7), the webhook's own denials (11), another webhook (13), the
    # mutating one (17), nor another metric (19).
    assert call_failures(TEXT, "policy.sandman.dev") == 5
    assert call_failures(TEXT, "absent.sandman.dev") == 0


def test_label_values_with_quotes_and_a_broken_sample_line() -> None:
    assert labels(r'name="a\"b",type="validating"') == {"name": 'a"b', "type": "validating"}
    broken = [
        f'{M}{{error_type="calling_webhook_error",name="w",operation="UPDATE",type="validating"}}'
    ]
    assert call_failures(broken, "w") == 0


@pytest.mark.parametrize(
    ("previous", "current", "failed"),
    [
        (None, 5.0, False),  # the first reading is the baseline
        (5.0, 5.0, False),  # no new failure
        (5.0, 6.0, True),  # one new failure since the last reading
        (5.0, 2.0, False),  # went down: a restarted or another apiserver, new baseline
    ],
)
def test_rose(previous: float | None, current: float, failed: bool) -> None:
    assert rose(previous, current) is failed
