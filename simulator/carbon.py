"""Hourly grid carbon intensity: the series, its CSV reader (Electricity Maps format), and its rules.

A :class:`CarbonSeries` holds points (UTC instant, gCO2eq/kWh), strictly increasing in time; each
value holds from its instant until the next point, at most one hour (Electricity Maps publishes
one value per hour, stamped at the hour's start). The rules that keep a number from being silently
wrong:

* times with an offset (``2024-01-01T05:00+05:00``) are converted to UTC, not stripped; times
  without one are UTC (the CSV column is ``Datetime (UTC)``);
* rows may come in any order (they are sorted); an instant given twice is refused, naming both
  rows;
* values must be finite, >= 0 and at most the ``carbon_intensity`` limit;
* an iteration is priced with the time-weighted mean intensity over ``[start, start + T)``, and
  every second of that span must be covered: a span that starts before the first point, ends after
  the last point's hour, or crosses a gap (two points more than an hour apart) is refused with the
  missing range.
"""

from __future__ import annotations

import bisect
import datetime as dt
import itertools
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from mindpipe.traces.errors import ContractError
from mindpipe.traces.limits import limit
from mindpipe.traces.reading import CARBON_CSV, parse_float, read_csv

HOUR = dt.timedelta(hours=1)
MAX_TIME_CHARS = 40


def utc(when: dt.datetime) -> dt.datetime:
    """``when`` as an aware UTC datetime (naive times are taken as UTC; offsets are converted)."""
    return when.replace(tzinfo=dt.UTC) if when.tzinfo is None else when.astimezone(dt.UTC)


def stamp(when: dt.datetime) -> str:
    """``2024-01-01T04:00:00Z``."""
    return utc(when).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str, source: str, key: str) -> dt.datetime:
    """An ISO date and time (``2024-01-01 04:00:00``, ``...Z``, ``...+05:00``) as aware UTC.

    Raises:
        ContractError: ``source: key: 'yesterday' is not an ISO date and time``.
    """
    t = text.strip()
    try:
        if len(t) > MAX_TIME_CHARS:
            raise ValueError
        return utc(dt.datetime.fromisoformat(t))
    except (ValueError, OverflowError):
        shown = repr(t) if len(t) <= MAX_TIME_CHARS else repr(t[:20] + "...")
        raise ContractError(source, key, f"{shown} is not an ISO date and time (YYYY-MM-DDTHH:MM, UTC "
                                         "unless an offset is given)") from None


@dataclass(frozen=True)
class CarbonSeries:
    """Grid carbon intensity over time (see the module docstring).

    Attributes:
        times: Aware UTC instants, strictly increasing.
        values: gCO2eq/kWh from each instant on.
        source: The file (or label) errors name.
    """

    times: tuple[dt.datetime, ...]
    values: tuple[float, ...]
    source: str = "<series>"

    def __post_init__(self) -> None:
        if not self.times or len(self.times) != len(self.values):
            raise ContractError(self.source, None, "a carbon series needs at least one (time, value) point")
        for i, (a, b) in enumerate(itertools.pairwise(self.times)):
            if not a < b:
                raise ContractError(self.source, f"point {i + 2}", f"times must increase: {stamp(b)} after {stamp(a)}")
        top = limit("carbon_intensity")
        for i, v in enumerate(self.values):
            if not 0.0 <= v <= top:  # also false for NaN
                raise ContractError(self.source, f"point {i + 1}", f"intensity {v} must be in [0, {top:g}] g/kWh")

    @classmethod
    def of(cls, points: Iterable[tuple[dt.datetime, float]], source: str = "<series>") -> CarbonSeries:
        """A series from (time, value) pairs in any order (naive times are UTC; duplicates refused)."""
        pairs = [(utc(t), float(v), n) for n, (t, v) in enumerate(points, start=1)]
        return cls._sorted(pairs, source, "point")

    @classmethod
    def _sorted(cls, pairs: list[tuple[dt.datetime, float, int]], source: str, unit: str) -> CarbonSeries:
        pairs.sort(key=lambda p: (p[0], p[2]))
        for (a, _, na), (b, _, nb) in itertools.pairwise(pairs):
            if a == b:
                raise ContractError(source, f"{unit} {nb}", f"{unit} {nb}: {stamp(b)} repeats {unit} {na} (each "
                                                             "instant may appear once)")
        return cls(tuple(p[0] for p in pairs), tuple(p[1] for p in pairs), source)

    def __iter__(self) -> Iterator[tuple[dt.datetime, float]]:
        return iter(zip(self.times, self.values, strict=True))

    def __len__(self) -> int:
        return len(self.times)

    @property
    def end(self) -> dt.datetime:
        """Where the series stops: one hour after its last point."""
        return self.times[-1] + HOUR

    def _until(self, i: int) -> dt.datetime:
        """End of point ``i``'s validity: the next point, at most an hour on."""
        nxt = self.times[i + 1] if i + 1 < len(self.times) else self.end
        return min(nxt, self.times[i] + HOUR)

    def check_covers(self, start: dt.datetime, duration_s: float = 0.0) -> None:
        """Raise unless every instant of ``[start, start + duration_s]`` has a value.

        Raises:
            ContractError: naming the series, the span and the missing range.
        """
        self.intensity_over(start, duration_s)

    def intensity_over(self, start: dt.datetime, duration_s: float = 0.0) -> float:
        """Time-weighted mean intensity over ``[start, start + duration_s]`` (the point's value if 0).

        Raises:
            ContractError: the span leaves the series or crosses a gap (the missing range named).
        """
        begin = utc(start)
        try:
            finish = begin + dt.timedelta(seconds=max(0.0, duration_s))
        except OverflowError:  # a span past year 9999 leaves any series
            finish = dt.datetime.max.replace(tzinfo=dt.UTC)
        span = stamp(begin) if finish == begin else f"{stamp(begin)} to {stamp(finish)}"
        if begin < self.times[0] or finish > self.end or (duration_s <= 0 and begin >= self.end):
            raise ContractError(self.source, "start", f"{span} is outside the series, which covers "
                                                      f"{stamp(self.times[0])} to {stamp(self.end)}")
        i = bisect.bisect_right(self.times, begin) - 1
        total, t = 0.0, begin
        while True:
            until = self._until(i)
            if t >= until:
                raise ContractError(self.source, "start", f"no intensity from {stamp(until)} to "
                                                          f"{stamp(self.times[i + 1])} (missing hours), which "
                                                          f"{span} needs")
            seg_end = min(until, finish)
            total += self.values[i] * (seg_end - t).total_seconds()
            if seg_end >= finish:
                break
            t = seg_end
            i = bisect.bisect_right(self.times, t) - 1  # the next point, or this one again if t is in a gap
        seconds = (finish - begin).total_seconds()
        return total / seconds if seconds > 0 else self.values[i]


Hourly = tuple["CarbonSeries | Sequence[tuple[dt.datetime, float]]", dt.datetime]
"""What ``simulate`` takes for hourly pricing: a series (or time, value pairs) and the iteration's start."""


def load_carbon_csv(path: str | os.PathLike[str]) -> CarbonSeries:
    """Read an Electricity Maps hourly CSV: a ``Datetime`` column and an LCA (else direct) intensity column.

    Raises:
        ContractError: see :mod:`mindpipe.traces.reading`; also missing columns, a header without
            data rows, unparsable times or values (naming the line) and repeated instants.
    """
    name = os.fspath(path)
    rows = read_csv(path, CARBON_CSV, max_rows=int(limit("carbon_rows")))
    if not rows:
        raise ContractError(name, None, "empty file")
    header = rows[0]
    t_col = next((i for i, c in enumerate(header) if c.strip().lower().startswith("datetime")), None)
    if t_col is None:
        raise ContractError(name, "Datetime (UTC)", "no datetime column in the header (line 1)")
    cols = [i for i, c in enumerate(header) if "carbon intensity" in c.lower()]
    if not cols:
        raise ContractError(name, "Carbon Intensity", "no carbon intensity column in the header (line 1)")
    v_col = ([i for i in cols if "lca" in header[i].lower()] or cols)[0]
    if v_col == t_col:  # one field holds both names: another separator (a spreadsheet's ';')
        raise ContractError(name, "Datetime (UTC)", f"line 1 is one field, {header[0][:60]!r}: the file must be "
                                                    "comma-separated (Electricity Maps' CSV export)")
    top = limit("carbon_intensity")
    pairs: list[tuple[dt.datetime, float, int]] = []
    for n, row in enumerate(rows[1:], start=2):
        if not any(c.strip() for c in row):
            continue
        if len(row) <= max(t_col, v_col):
            raise ContractError(name, f"line {n}", f"line {n}: {len(row)} fields, the header has {len(header)}")
        when = parse_time(row[t_col], name, f"line {n}")
        pairs.append((when, parse_float(row[v_col], name, f"line {n}", 0.0, top), n))
    if not pairs:
        raise ContractError(name, None, "no data rows after the header")
    return CarbonSeries._sorted(pairs, name, "line")


__all__ = ["CarbonSeries", "Hourly", "load_carbon_csv", "parse_time", "stamp", "utc"]
