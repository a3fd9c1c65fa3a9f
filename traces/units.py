"""Wording shared by printed text and plots: counted nouns and a unit chosen from the data's magnitude.

Printed lines say "1 plan" and "2 plans" (:func:`plural`); plots label an axis in the unit that puts
its values between 1 and 1000 where it can (:func:`scaled_unit`), so a 1.5 kJ iteration is drawn as
1.5 kJ, not 0.0015 MJ. JSON keys and values never go through these: they stay in their SI units.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

ENERGY_UNITS: tuple[tuple[str, float], ...] = (("J", 1.0), ("kJ", 1e3), ("MJ", 1e6), ("GJ", 1e9), ("TJ", 1e12))
"""Joules and their multiples (name, joules per unit), smallest first."""

CARBON_UNITS: tuple[tuple[str, float], ...] = (("gCO2", 1.0), ("kgCO2", 1e3), ("tCO2", 1e6), ("ktCO2", 1e9))
"""Grams of CO2 and their multiples (name, grams per unit), smallest first."""


def plural(count: float, noun: str, many: str | None = None) -> str:
    """``count`` and ``noun``, the noun singular only for exactly one (``many``: an irregular plural).

    >>> plural(1, "plan"), plural(3, "plan"), plural(0, "entry", "entries")
    ('1 plan', '3 plans', '0 entries')
    """
    word = noun if count == 1 else (many if many is not None else noun + "s")
    return f"{count} {word}"


def scaled_unit(values: Iterable[float], units: Sequence[tuple[str, float]]) -> tuple[str, float]:
    """The largest unit of ``units`` (smallest first) in which the largest finite ``|value|`` is >= 1.

    Values smaller than one of the smallest unit keep the smallest unit; no finite value also does.

    Returns:
        (unit name, base units per unit): divide the values by the second to draw them in the first.
    """
    top = max((abs(v) for v in values if math.isfinite(v)), default=0.0)
    chosen = units[0]
    for name, scale in units:
        if top >= scale:
            chosen = (name, scale)
    return chosen


__all__ = ["CARBON_UNITS", "ENERGY_UNITS", "plural", "scaled_unit"]
