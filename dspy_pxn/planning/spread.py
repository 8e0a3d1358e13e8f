"""How long a batch of LM calls takes when call times vary: the runtime model's latency spread.

A batch on a pool ends with its slowest call, so with the same median call time a long tail
makes every screening (the slowest of m calls), every validation (the slowest of up to W) and
the seed's validation longer, and a pool of W workers does W / mean calls a second, not
W / median. At W = 256 with p99/p50 = 4, a run predicted from medians alone took twice as long
as predicted (``docs/benchmarks.md``, "W = 256"): the tail, not the median, sets a wide run's
pace.

Call times are modelled as lognormal around the median, the shape described by its p99/p50
ratio (API dashboards report both): σ = ln(ratio) / z₀.₉₉. A ratio of 1 is fixed call times,
and every factor below is then exactly 1, so a model without a spread predicts what it did.
"""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist

Z_99 = NormalDist().inv_cdf(0.99)
# Points of the quadrature for the expected maximum; 4,000 keep it within 0.2% up to k = 4,096, σ = 1.
_QUADRATURE_POINTS = 4000


def sigma_of(p99_ratio: float) -> float:
    """σ of the lognormal whose p99 is ``p99_ratio`` times its median."""
    if isinstance(p99_ratio, bool) or not isinstance(p99_ratio, (int, float)) or not math.isfinite(p99_ratio) \
            or p99_ratio < 1:
        raise ValueError(f"latency_p99_ratio={p99_ratio!r} must be a number >= 1: a call's p99 time over its "
                         "median (1 for fixed call times; 4 is typical of hosted LM APIs).")
    return math.log(p99_ratio) / Z_99


def mean_factor(sigma: float) -> float:
    """A call's mean time over its median: what a saturated pool pays per call."""
    return math.exp(sigma * sigma / 2)


@lru_cache(maxsize=4096)
def slowest_factor(calls: int, sigma: float) -> float:
    """E[slowest of ``calls`` independent calls] over the median.

    E[max] = ∫₀¹ F⁻¹(v^(1/k)) dv (the max of k uniforms is distributed as v^(1/k)), by the midpoint
    rule; for the lognormal F⁻¹(u) = median · exp(σ Φ⁻¹(u)).
    """
    if calls < 1:
        return 0.0
    if sigma == 0:
        return 1.0
    normal = NormalDist()
    total = 0.0
    for i in range(_QUADRATURE_POINTS):
        u = ((i + 0.5) / _QUADRATURE_POINTS) ** (1.0 / calls)
        total += math.exp(sigma * normal.inv_cdf(min(u, 1 - 1e-15)))
    return total / _QUADRATURE_POINTS


def batch_seconds(calls: int, workers: int, median_s: float, sigma: float) -> float:
    """Seconds for ``calls`` calls on ``workers`` workers, the batch done when its slowest call is.

    Full waves before the last go at the mean call time (the pool refills as calls end); the
    last ends with the slowest of the calls in flight. With σ = 0 this is waves × the call time.
    """
    if calls <= 0:
        return 0.0
    waves = math.ceil(calls / workers)
    return median_s * ((waves - 1) * mean_factor(sigma) + slowest_factor(min(calls, workers), sigma))
