"""Pure statistics: percentiles, spreads, steady-window throughput, ratios."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (``q`` in 0..100); None for no values.

    >>> percentile([1, 2, 3, 4], 50)
    2.5
    >>> percentile([5], 99)
    5.0
    """
    if not values:
        return None
    xs = sorted(float(v) for v in values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * min(max(q, 0.0), 100.0) / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float | None:
    return percentile(values, 50.0)


@dataclass(frozen=True)
class Spread:
    """Median with min/max and relative half-range, for figures over repeats or windows."""

    median: float
    low: float
    high: float
    n: int

    @property
    def rel(self) -> float:
        """Half the range over the median (0.05 = ±5 %)."""
        return (self.high - self.low) / 2 / self.median if self.median else 0.0

    def to_json(self) -> dict[str, float | int]:
        return {
            "median": self.median,
            "min": self.low,
            "max": self.high,
            "n": self.n,
            "rel_spread": round(self.rel, 4),
        }


def spread(values: Sequence[float]) -> Spread | None:
    """Median, min and max of ``values``; None when empty.

    >>> spread([3.0, 1.0, 2.0]).to_json()
    {'median': 2.0, 'min': 1.0, 'max': 3.0, 'n': 3, 'rel_spread': 0.5}
    """
    if not values:
        return None
    m = median(values)
    assert m is not None
    return Spread(m, float(min(values)), float(max(values)), len(values))


def summarize(values: Sequence[float], qs: Sequence[float] = (50, 99)) -> dict[str, float] | None:
    """``{"p50": ..., "p99": ..., "max": ..., "n": ...}`` of ``values``; None when empty."""
    if not values:
        return None
    out: dict[str, float] = {}
    for q in qs:
        p = percentile(values, q)
        assert p is not None
        out[f"p{q:g}".replace(".", "")] = round(p, 3)
    out["max"] = round(float(max(values)), 3)
    out["n"] = len(values)
    return out


def interpolate(samples: Sequence[tuple[float, float]], t: float) -> float:
    """Value at time ``t`` of a non-decreasing step series sampled at ``samples``."""
    if not samples:
        return 0.0
    if t <= samples[0][0]:
        return samples[0][1]
    for (t0, v0), (t1, v1) in itertools.pairwise(samples):
        if t0 <= t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return samples[-1][1]


@dataclass(frozen=True)
class SteadyWindow:
    """Throughput over the part of a run between ``lo`` and ``hi`` of its progress."""

    rate: float
    t_start: float
    t_end: float
    #: per-bucket rates inside the window (for the median and spread over time)
    bucket_rates: tuple[float, ...]


def steady_window(
    samples: Sequence[tuple[float, float]],
    total: float,
    *,
    lo: float = 0.1,
    hi: float = 0.9,
    bucket_s: float = 0.5,
) -> SteadyWindow | None:
    """Rate of progress between the first sample past ``lo * total`` and the last before ``hi``.

    ``samples`` are ``(time, progress)`` with progress non-decreasing (bytes of
    input read, events counted). Start-up (interpreter, JIT, first file read)
    and the drain at the end fall outside the window. None when fewer than two
    distinct samples fall inside it.

    >>> w = steady_window([(t / 10, 100.0 * t) for t in range(11)], 1000.0, bucket_s=0.2)
    >>> round(w.rate), w.t_start, w.t_end
    (1000, 0.1, 0.9)
    """
    if total <= 0:
        return None
    pts = sorted(samples)
    inside = [(t, v) for t, v in pts if lo * total <= v <= hi * total]
    if len(inside) < 2:
        return None
    (t0, v0), (t1, v1) = inside[0], inside[-1]
    if t1 <= t0 or v1 <= v0:
        return None
    rates: list[float] = []
    edge = t0
    while edge + bucket_s <= t1 + 1e-9:
        a, b = interpolate(pts, edge), interpolate(pts, edge + bucket_s)
        rates.append((b - a) / bucket_s)
        edge += bucket_s
    return SteadyWindow((v1 - v0) / (t1 - t0), t0, t1, tuple(rates))


def slowest_reader(
    samples: Sequence[tuple[float, Sequence[float]]], sizes: Sequence[float]
) -> list[tuple[float, float]]:
    """Progress of readers that run in parallel, paced by the one furthest behind.

    ``samples`` are ``(time, bytes read of each input)``. A job's input is done
    when its slowest reader is, so its progress is that reader's share of its
    input times the whole input. The summed read positions instead let the
    readers that are ahead stand in for the one behind: with two worker
    processes, one ending early leaves the other's lone tail past 90 % of the
    sum, outside :func:`steady_window`'s window, which then reports the rate
    of both running as the job's.

    >>> slowest_reader([(1.0, (50.0, 20.0)), (2.0, (100.0, 60.0))], [100.0, 100.0])
    [(1.0, 40.0), (2.0, 120.0)]
    """
    total = float(sum(sizes))
    if not sizes or total <= 0:
        return []
    return [
        (t, total * min(v / s if s > 0 else 1.0 for v, s in zip(vs, sizes, strict=True)))
        for t, vs in samples
    ]


def step_rate(
    samples: Sequence[tuple[float, float]], total: float, *, lo: float = 0.1, hi: float = 0.9
) -> float | None:
    """Rate between the first and the last *rise* of a staircase inside ``lo..hi`` of ``total``.

    Committed output grows in steps, one per checkpoint. :func:`steady_window`
    on such samples ends on the plateau before the step past ``hi``, so it
    divides n steps' records by n + 1 steps' time (and with fewer than two
    samples inside it has no window at all). From rise to rise, whole
    checkpoint periods are counted. None with fewer than two rises inside.

    >>> stairs = [(t / 10, 100.0 * (t // 10)) for t in range(61)]  # 100 every 1 s
    >>> step_rate(stairs, 600.0)
    100.0
    >>> round(steady_window(stairs, 600.0).rate)  # four steps over five periods
    82
    """
    pts = sorted(samples)
    rises = [(t, v) for (_, before), (t, v) in itertools.pairwise(pts) if v > before]
    inside = [(t, v) for t, v in rises if lo * total <= v <= hi * total]
    if len(inside) < 2:
        return None
    (t0, v0), (t1, v1) = inside[0], inside[-1]
    return (v1 - v0) / (t1 - t0)


def ratio(value: float | None, ours: float | None) -> float | None:
    """``value / ours`` rounded to 3 places; None when either is missing or ours is 0.

    >>> ratio(50.0, 200.0), ratio(None, 1.0), ratio(1.0, 0.0)
    (0.25, None, None)
    """
    if value is None or ours is None or ours == 0:
        return None
    return round(value / ours, 3)
