"""One seam for what happens inside a step: reporters tell it, listeners hear it.

gepa's own callbacks say when an iteration starts and ends and which candidates were
accepted; they do not say when screening starts, how long the reflections took, or which
evaluations are the parents' (whose traces reflection reads). Those are known to the
strategies, the adapter and the reflection strategy, which report them here:

    tasks_sampled(tasks)                  DistinctParentsPxN: the step's proposal tasks are drawn
    children_screened(improved)           BudgetCappedSelection: screening is over, selection begins
    evaluated(seconds, rollouts, failed)  BatchedAdapter: one batch of rollouts finished
    reflected(seconds, jobs, failed)      PooledReflection: the step's reflections finished

Listeners implement any of these methods: the step recorder (phase times, counts) and
the adapter's trace marking (a sampled parent's minibatch must be traced). A schedule
other than gepa's step loop reports to the same seam.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gepa.strategies.proposal_sampling import ProposalTask

EVENTS = ("tasks_sampled", "children_screened", "evaluated", "reflected")


class StepEvents:
    """Fan-out of a run's step events to its listeners, in the order they were added."""

    def __init__(self, listeners: Sequence[Any] = ()):
        self.listeners: list[Any] = []
        for listener in listeners:
            self.add(listener)

    def add(self, listener: Any) -> None:
        if not any(callable(getattr(listener, name, None)) for name in EVENTS):
            raise TypeError(f"{listener!r} implements none of the step events {EVENTS}.")
        self.listeners.append(listener)

    def _emit(self, name: str, *args: Any) -> None:
        for listener in self.listeners:
            method = getattr(listener, name, None)
            if method is not None:
                method(*args)

    def tasks_sampled(self, tasks: list[ProposalTask]) -> None:
        self._emit("tasks_sampled", tasks)

    def children_screened(self, improved: int) -> None:
        self._emit("children_screened", improved)

    def evaluated(self, seconds: float, rollouts: int, failures: int) -> None:
        self._emit("evaluated", seconds, rollouts, failures)

    def reflected(self, seconds: float, jobs: int, failed: int) -> None:
        self._emit("reflected", seconds, jobs, failed)
