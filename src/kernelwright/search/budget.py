"""How a problem's search budget is shared among its units."""
from __future__ import annotations

__all__ = ["shares"]


def shares(total: float, weights: list[float], minimum: float) -> list[float]:
    """Split `total` over units in proportion to `weights` (a unit's minimum bytes moved: a proxy
    for its run time, so the search spends its trials where the time is), each getting at least
    `minimum` (the seed configs must run even for a tiny unit, e.g. a 300 KB weight copy beside a
    1.6 GB norm). Units above the minimum share what the minimums leave, so the sum exceeds
    `total` only when the minimums alone do."""
    if not weights:
        return []
    out = [float(minimum)] * len(weights)
    free = [k for k in range(len(weights))]
    while free:
        left = total - sum(out[k] for k in range(len(weights)) if k not in free)
        mass = sum(max(weights[k], 0.0) for k in free)
        prop = {k: (left * max(weights[k], 0.0) / mass if mass > 0 else left / len(free)) for k in free}
        low = [k for k in free if prop[k] < minimum]
        if not low:
            for k in free:
                out[k] = prop[k]
            break
        free = [k for k in free if k not in low]  # these keep the minimum; share the rest again
    return out
