"""How a prepared run is searched: a ``Schedule`` takes the run and its live parts and returns gepa's result.

    steps   StepSchedule   gepa's own step loop (``gepa.optimize``), P×N wide: one step at a time
    async   AsyncSchedule  P·N proposal pipelines always in flight over gepa's state: no step barrier

Both drive the same gepa parts (``parts.gepa_parts``) on the same adapter, pool and budget guard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from gepa.core.result import GEPAResult

from dspy_pxn.schedules.asynchronous import AsyncSchedule
from dspy_pxn.schedules.steps import StepSchedule

if TYPE_CHECKING:  # types only: the run imports the schedules, never the other way round
    from dspy_pxn.engine.run import Live, Run


class Schedule(Protocol):
    """Searches a prepared run on its live parts; returns what ``gepa.optimize`` returns."""

    def run(self, run: Run, live: Live) -> GEPAResult: ...


SCHEDULES: dict[str, Schedule] = {"steps": StepSchedule, "async": AsyncSchedule}

__all__ = ["SCHEDULES", "AsyncSchedule", "Schedule", "StepSchedule"]
