"""The settlement split: one holder's pay for one forward, cut into holder, router and burn.

Pure module (no Django). Decimal arithmetic throughout, never a float: amounts are
quantized to 12 decimal places (the ledger columns'), and the three parts add up to the
gross exactly because the burn is what is left after the two shares are cut::

    gross  = price × tokens                       rounded half-even to 1e-12
    holder = gross × holder_share                 rounded down to 1e-12
    router = gross × router_share                 rounded down to 1e-12
    burn   = gross − holder − router              exact; ≥ 0 since both shares round down
                                                  and holder_share + router_share ≤ 1

Rounding the shares down, not to nearest, is what keeps the burn from going negative
when the shares sum to exactly 1 (two half-ups could overshoot the gross by 1e-12).
"""

from __future__ import annotations

from decimal import ROUND_DOWN, ROUND_HALF_EVEN, Decimal, localcontext

QUANTUM = Decimal(1).scaleb(-12)
# The ledger's columns hold 30 digits, 12 after the point: amounts stay below 10**18.
MAX_AMOUNT = Decimal(10) ** 18


def split_amounts(price: Decimal, tokens: int, holder_share: Decimal,
                  router_share: Decimal) -> tuple[Decimal, Decimal, Decimal, Decimal]:
    """(gross, holder, router, burn) for ``tokens`` input tokens at ``price`` each.

    Preconditions, each checked (ValueError naming it): ``price`` a finite Decimal ≥ 0,
    ``tokens`` an int ≥ 0, both shares finite Decimals in [0, 1] whose sum is ≤ 1, and a
    gross below MAX_AMOUNT.
    """
    _check_decimal(price, "price")
    if type(tokens) is not int or tokens < 0:
        raise ValueError(f"tokens must be an integer >= 0, got {tokens!r}")
    _check_decimal(holder_share, "holder_share", most=Decimal(1))
    _check_decimal(router_share, "router_share", most=Decimal(1))
    if holder_share + router_share > 1:
        raise ValueError(f"holder_share + router_share must be <= 1, got {holder_share} + {router_share}")
    # Enough precision that no product below is rounded before the explicit quantize.
    with localcontext() as ctx:
        ctx.prec = 80
        gross = (price * tokens).quantize(QUANTUM, rounding=ROUND_HALF_EVEN)
        if gross >= MAX_AMOUNT:
            raise ValueError(f"price × tokens = {gross} is beyond the ledger's range (< 10**18)")
        holder = (gross * holder_share).quantize(QUANTUM, rounding=ROUND_DOWN)
        router = (gross * router_share).quantize(QUANTUM, rounding=ROUND_DOWN)
        burn = gross - holder - router
    return gross, holder, router, burn


def _check_decimal(value: object, name: str, *, most: Decimal | None = None) -> None:
    if not isinstance(value, Decimal) or not value.is_finite() or value < 0 or (most is not None and value > most):
        bound = f" and <= {most}" if most is not None else ""
        raise ValueError(f"{name} must be a finite Decimal >= 0{bound}, got {value!r}")
