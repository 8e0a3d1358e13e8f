"""How long a simulated LM call takes: fixed, or drawn from a seeded distribution; and what was slept.

Real LM latency varies, and a parallel optimizer's schedule is judged by how it copes: a
step that waits for its slowest rollout loses more under a long tail than a schedule that
does not wait. The configured latency is each distribution's *median*:

- ``fixed``: exactly the configured latency (the default, and the only option before issue 14).
- ``lognormal``: median × exp(σZ), σ = ln 4 / 2.326 ≈ 0.596, so p99/p50 = 4 (as real
  API latencies are often described). Its mean is exp(σ²/2) ≈ 1.19 × the median.
- ``heavy``: the lognormal body, except that 3% of calls are stragglers taking a uniform
  5-20 × the median (a queued or retried request at a provider). Quantiles over
  1,000,000 draws, as multiples of the median (``tests/test_latency_server.py`` checks
  them on 200,000): p50 1.02, p90 2.39, p99 15.0, max 20.0, mean 1.53
  (lognormal: p50 1.00, p90 2.15, p99 4.00, max 16.6, mean 1.19).

Draws are seeded: one generator per call kind, each seeded from (seed, kind), so the
sequence of task latencies does not depend on how many reflection calls came between.
Threads take draws in whatever order they arrive, so the *sequence* is reproducible for
a given seed, not which request got which draw.
"""

from __future__ import annotations

import math
import random
import threading
from typing import Any

DISTRIBUTIONS = ("fixed", "lognormal", "heavy")

# p99/p50 of a lognormal is exp(z_0.99 σ); z_0.99 = 2.326, so σ = ln 4 / 2.326 gives 4.
LOGNORMAL_SIGMA = math.log(4.0) / 2.326
STRAGGLER_RATE = 0.03
STRAGGLER_FACTOR = (5.0, 20.0)


def check_distribution(distribution: str) -> str:
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown latency distribution {distribution!r}: choose one of {', '.join(DISTRIBUTIONS)}")
    return distribution


def draw_latency(median: float, distribution: str, rng: random.Random) -> float:
    """One call's latency in seconds; ``median`` is the configured latency."""
    if distribution == "fixed" or median <= 0:
        return median
    body = median * math.exp(rng.gauss(0.0, LOGNORMAL_SIGMA))
    if distribution == "heavy" and rng.random() < STRAGGLER_RATE:
        return median * rng.uniform(*STRAGGLER_FACTOR)
    return body


def quantile(ordered: list[float], q: float) -> float:
    """Linear-interpolated quantile of an ascending list (numpy's default method)."""
    if not ordered:
        return 0.0
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class LatencySampler:
    """Seeded latency draws per call kind, and a record of every latency handed out (= slept).

    Shared by a ``SimulatedLM`` and its copies, or owned by the latency server, so the
    stats a benchmark prints are the latencies the calls actually took.
    """

    def __init__(self, distribution: str = "fixed", seed: int = 0) -> None:
        self.distribution = check_distribution(distribution)
        self.seed = seed
        self._lock = threading.Lock()
        self._rngs: dict[str, random.Random] = {}
        self._slept: dict[str, list[float]] = {}

    def __getstate__(self) -> dict:
        """Picklable (a program logged as an MLflow model carries its LM): the copy gets its own lock."""
        return {key: value for key, value in self.__dict__.items() if key != "_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def draw(self, kind: str, median: float) -> float:
        """The next latency for a ``kind`` call, recorded as slept."""
        with self._lock:
            rng = self._rngs.get(kind)
            if rng is None:
                rng = self._rngs[kind] = random.Random(f"{self.seed}:{kind}")
            value = draw_latency(median, self.distribution, rng)
            self._slept.setdefault(kind, []).append(value)
        return value

    def reset(self) -> None:
        """Forget what was slept; the draw sequence carries on (it is the run's, not the window's)."""
        with self._lock:
            self._slept.clear()

    def summary(self) -> dict[str, Any]:
        """Per kind: count, mean, p50, p99, max of the latencies slept (seconds); plus the settings."""
        with self._lock:
            slept = {kind: sorted(values) for kind, values in self._slept.items()}
        out: dict[str, Any] = {"distribution": self.distribution, "seed": self.seed}
        for kind in ("task", "reflection", *sorted(set(slept) - {"task", "reflection"})):
            values = slept.get(kind, [])
            out[kind] = {
                "count": len(values),
                "mean": sum(values) / len(values) if values else 0.0,
                "p50": quantile(values, 0.50),
                "p99": quantile(values, 0.99),
                "max": values[-1] if values else 0.0,
            }
        return out
