"""Quantities: read exactly, or refused with ValueError (never another exception)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from sandman.quantity import parse_quantity


def test_quantities_read_exactly() -> None:
    assert parse_quantity("500m") == Decimal("0.5")
    assert parse_quantity("2Gi") == 2 * 2**30
    assert parse_quantity("1e3") == 1000


@pytest.mark.parametrize(
    "text", ["1e999999999Ki", "1e999999999", "9" * 65, ".", "1..2", "+-1", "", None, 5]
)
def test_out_of_range_and_malformed_quantities_are_value_errors(text: object) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity(text)  # type: ignore[arg-type]
