"""The run's pace and its one clock: rollouts and reflections so far, how long they took, and the time left.

The search's clock starts here (``start``): the wall-clock a result reports and the deadline the
caps hold (``RunCaps.seconds_left``) are read from it. The dollar and deadline caps plan from the
pace (what the next piece of work will cost and how long it will take), and each step record tells
from it how long until the first budget binds. One keeper for all of it, so none can disagree; it
knows nothing of the ledger or the caps (it is told their numbers).
"""

from __future__ import annotations

import threading
import time

from dspy_pxn.engine.events import Phase, StepListener, override

RECENT = 50  # the medians read the latest this many measurements: a run's latency drifts


class RunPace(StepListener):
    """Hears every batch of rollouts and every reflection of the run; one per compile."""

    def __init__(self, workers: int = 1):
        self.workers = workers  # the pool's W, for the rounds a batch of rollouts takes
        self.started, self.started_epoch = time.perf_counter(), time.time()
        self._lock = threading.Lock()
        self.rollouts = self.reflections = 0
        self._batches = 0
        self._wave_s: list[float] = []
        self._reflection_s: list[float] = []
        self._metric_calls0: int | None = None  # spent when the search began (the seed, or a resumed run's)
        self._usd0: float | None = None

    def start(self, workers: int, spent_usd: float) -> None:
        """The search begins on a pool of ``workers``, ``spent_usd`` spent before it (a resumed run's)."""
        self.workers, self._usd0 = workers, spent_usd
        self.started, self.started_epoch = time.perf_counter(), time.time()

    def elapsed(self) -> float:
        """Seconds since the search began: the run's one clock."""
        return time.perf_counter() - self.started

    def now_epoch(self) -> float:
        """The run's clock as a Unix time (what a step record's ``started_at`` says)."""
        return self.started_epoch + self.elapsed()

    def steps_begin(self, metric_calls: int) -> None:
        """The first step begins with this many metric calls spent (the seed's validation, a resumed run's)."""
        if self._metric_calls0 is None:
            self._metric_calls0 = metric_calls

    @override
    def evaluated(self, phase: Phase, seconds: float, rollouts: int, failures: int) -> None:
        with self._lock:
            self.rollouts += rollouts
            self._batches += 1
            if rollouts and self._batches > 1:  # the first batch pays the run's one-off costs (imports, connections)
                self._wave_s.append(seconds / -(-rollouts // self.workers))  # a batch wider than the pool: waves

    @override
    def reflected(self, seconds: float, jobs: int, failed: int) -> None:
        with self._lock:
            self.reflections += jobs
            self._reflection_s.append(seconds)

    def wave_s(self) -> float:
        """The median seconds one wave of rollouts (one per worker) takes; 0 before any was measured."""
        return _median(self._wave_s)

    def reflection_s(self) -> float:
        return _median(self._reflection_s)

    def time_left(self, metric_calls: int, budget: int, spent_usd: float, usd_left: float | None,
                  seconds_left: float | None) -> tuple[float | None, str | None]:
        """Seconds until the first budget binds at the pace this compile has kept, and that budget's name: the
        metric calls left at the calls a second so far, the dollars left (``usd_left``, None: no cap) at the
        dollars a second so far (``spent_usd`` in all), the deadline's own ``seconds_left``."""
        elapsed = self.elapsed()
        if elapsed <= 0:
            return None, None
        estimates: dict[str, float] = {}
        if (calls := metric_calls - (self._metric_calls0 or 0)) > 0:
            estimates["max_metric_calls"] = max(0, budget - metric_calls) * elapsed / calls
        spent = spent_usd - (self._usd0 or 0.0)
        if usd_left is not None and spent > 0:
            estimates["max_cost_usd"] = usd_left * elapsed / spent
        if seconds_left is not None:
            estimates["max_wall_s"] = seconds_left
        if not estimates:
            return None, None
        first = min(estimates, key=estimates.__getitem__)
        return estimates[first], first


def _median(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values[-RECENT:])
    return ordered[len(ordered) // 2]
