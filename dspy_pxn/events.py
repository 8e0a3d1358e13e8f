"""One seam for what happens inside a step: reporters tell it, listeners hear it.

gepa's own callbacks say when an iteration starts and ends and which candidates were
accepted; they do not say when screening starts, how long the reflections took, or which
evaluations are the parents' (whose traces reflection reads). Those are known to the
strategies, the adapter and the reflection strategy, which report them here:

    tasks_sampled(tasks)                  DistinctParentsPxN: the step's proposal tasks are drawn
    children_screened(improved)           BudgetCappedSelection: screening is over, selection begins
    evaluated(seconds, rollouts, failed, phase)  BatchedAdapter: one batch of rollouts finished
    reflected(seconds, jobs, failed)      PooledReflection: the step's reflections finished
    merged(seconds, children)             SiblingMerge: the improving children were merged into one

Listeners implement any of these methods: the step recorder (phase times, counts) and
the adapter's trace marking (a sampled parent's minibatch must be traced). A schedule
other than gepa's step loop reports to the same seam.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Sequence
from typing import Any

from gepa.strategies.proposal_sampling import ProposalTask

EVENTS = ("tasks_sampled", "children_screened", "evaluated", "reflected", "merged")


class StepEvents:
    """Fan-out of a run's step events to its listeners, in the order they were added.

    The phase an evaluation belongs to ("screening" or "validation") is a context
    variable: sampling starts screening and selection starts validation in the thread
    that runs gepa's loop; an asynchronous schedule sets it in each of its own threads.
    """

    def __init__(self, listeners: Sequence[Any] = ()):
        self.phase: contextvars.ContextVar[str] = contextvars.ContextVar("dspy_pxn_phase", default="validation")
        self.listeners: list[Any] = []
        self.lock: Any = contextlib.nullcontext()
        for listener in listeners:
            self.add(listener)

    def add(self, listener: Any) -> None:
        if not any(callable(getattr(listener, name, None)) for name in EVENTS):
            raise TypeError(f"{listener!r} implements none of the step events {EVENTS}.")
        self.listeners.append(listener)

    def serialize_with(self, lock: Any) -> None:
        """Hear every event under ``lock``: a schedule that writes records while threads report
        (the async one) needs an event and its own bookkeeping to land in the same record."""
        self.lock = lock

    def _emit(self, name: str, *args: Any) -> None:
        with self.lock:
            for listener in self.listeners:
                method = getattr(listener, name, None)
                if method is not None:
                    method(*args)

    def tasks_sampled(self, tasks: list[ProposalTask]) -> None:
        self.phase.set("screening")
        self._emit("tasks_sampled", tasks)

    def children_screened(self, improved: int) -> None:
        self.phase.set("validation")
        self._emit("children_screened", improved)

    def evaluated(self, seconds: float, rollouts: int, failures: int) -> None:
        self._emit("evaluated", seconds, rollouts, failures, self.phase.get())

    def reflected(self, seconds: float, jobs: int, failed: int) -> None:
        self._emit("reflected", seconds, jobs, failed)

    def merged(self, seconds: float, children: int) -> None:
        self._emit("merged", seconds, children)
