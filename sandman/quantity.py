"""Kubernetes resource quantities ("500m", "2Gi", "1e3") as exact numbers."""

from __future__ import annotations

import re
from decimal import Decimal

_SUFFIX = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
_RE = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)$")


# No quantity a person or a tool writes is longer; the bound keeps a hostile
# policy file from making us parse (and multiply) thousands of digits.
_MAX_LEN = 64


def parse_quantity(text: str) -> Decimal:
    if not isinstance(text, str) or len(text) > _MAX_LEN:
        raise ValueError(f"{str(text)[:_MAX_LEN]!r} is not a quantity (e.g. 500m, 2Gi, 1.5)")
    m = _RE.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a quantity (e.g. 500m, 2Gi, 1.5)")
    try:
        return Decimal(m.group(1)) * _SUFFIX[m.group(2)]
    except ArithmeticError:  # InvalidOperation, and Overflow for "1e999999999Ki"
        raise ValueError(f"{text!r} is not a quantity (out of range)") from None
