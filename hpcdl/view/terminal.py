"""A run's curves as text, for a terminal with no display (jobs watch --plot over ssh)."""

from __future__ import annotations

import math
from typing import Sequence

BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 60) -> str:
    """``values`` as one line of bar characters, thinned evenly to at most ``width`` (each the mean of its
    stretch); empty when none is finite."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return ""
    count = min(width, len(finite))
    means = [sum(part) / len(part) for part in
             (finite[len(finite) * i // count: max(len(finite) * (i + 1) // count, len(finite) * i // count + 1)]
              for i in range(count))]
    low, high = min(means), max(means)
    span = high - low or 1.0
    return "".join(BARS[min(len(BARS) - 1, int((v - low) / span * len(BARS)))] for v in means)


def curve_line(label: str, values: Sequence[float], width: int = 60, percent: bool = False) -> str:
    """'label  ▇▅▃▂▁  first -> last (min .., max ..)' for one curve; empty when it has no finite value."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return ""
    shown = (lambda v: f"{100 * v:.1f}%") if percent else (lambda v: f"{v:.4g}")
    return (f"{label:<16s}{sparkline(finite, width)}  {shown(finite[0])} -> {shown(finite[-1])} "
            f"(min {shown(min(finite))}, max {shown(max(finite))})")
