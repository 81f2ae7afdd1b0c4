"""Kubernetes resource quantities (``128Mi``, ``500m``, ``1.5``, ``1e3``), parsed to exact decimals (pure).

Rules (apimachinery's ``resource.Quantity`` grammar, the parts clients write):

1. A quantity is an unsigned decimal number, optionally signed ``+``, followed by at most one suffix: a binary one
   (``Ki`` ... ``Ei``, powers of 1024), a decimal SI one (``n``, ``u``, ``m``, ``k``, ``M`` ... ``E``), or an
   exponent (``e3``, ``E-2`` is not one: ``E`` is exa). JSON numbers are read as their decimal text.
2. Anything else (a negative number, two suffixes, spaces, an empty string, a non-string) is a
   :class:`QuantityError` naming the text.
"""

from __future__ import annotations

import re
from decimal import Decimal, DecimalException
from typing import Any

from ambit.model.errors import QuantityError

_QUANTITY = re.compile(r"([+]?[0-9.]+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|e[0-9+-]+)?")
_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    **{s: Decimal(1024**i) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), start=1)},
}
_MAX_TEXT = 64


def parse_quantity(text: Any) -> Decimal:
    """Rules 1 and 2."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        text = str(text)
    match = _QUANTITY.fullmatch(text) if isinstance(text, str) and len(text) <= _MAX_TEXT else None
    if match is None:
        raise QuantityError(f"quantity {text!r} is not a Kubernetes quantity")
    number, suffix = match.group(1), match.group(2) or ""
    try:
        scale = Decimal(f"1{suffix}") if suffix.startswith("e") else _SUFFIX[suffix]
        value = Decimal(number) * scale
    except DecimalException:
        raise QuantityError(f"quantity {text!r} is not a Kubernetes quantity") from None
    if not value.is_finite():
        raise QuantityError(f"quantity {text!r} is not a Kubernetes quantity")
    return value
