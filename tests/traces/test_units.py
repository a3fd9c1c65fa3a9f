"""Counted nouns and units chosen from the data's magnitude (``traces/units.py``)."""

from __future__ import annotations

import math

import pytest
from mindpipe.traces.units import CARBON_UNITS, ENERGY_UNITS, plural, scaled_unit


def test_a_count_of_one_takes_the_singular():
    assert plural(1, "plan") == "1 plan" and plural(2, "plan") == "2 plans" and plural(0, "plan") == "0 plans"
    assert plural(1, "entry", "entries") == "1 entry" and plural(3, "entry", "entries") == "3 entries"


@pytest.mark.parametrize(("values", "unit"), [
    ([1500.0, 1400.0], ("kJ", 1e3)), ([0.5], ("J", 1.0)), ([999.0], ("J", 1.0)), ([1e6], ("MJ", 1e6)),
    ([-2.5e9, 1.0], ("GJ", 1e9)), ([math.nan, math.inf, 2e3], ("kJ", 1e3)), ([], ("J", 1.0)),
])
def test_energy_is_drawn_in_the_largest_unit_with_a_value_of_at_least_one(values, unit):
    assert scaled_unit(values, ENERGY_UNITS) == unit


def test_carbon_units_run_from_grams_to_kilotonnes():
    assert scaled_unit([15925.7], CARBON_UNITS) == ("kgCO2", 1e3)
    assert scaled_unit([3.2e7], CARBON_UNITS) == ("tCO2", 1e6)
    assert scaled_unit([12.0], CARBON_UNITS) == ("gCO2", 1.0)
