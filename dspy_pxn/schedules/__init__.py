"""How a prepared run is searched: ``search`` builds gepa's parts for it once and hands them, the run and its live
parts to its ``Schedule``, which returns gepa's result.

    steps   StepSchedule   gepa's own step loop (``gepa.optimize``), P×N wide: one step at a time
    async   AsyncSchedule  P·N proposal pipelines always in flight over gepa's state: no step barrier

Both drive the same gepa parts (``parts.gepa_parts``) on the same adapter, pool and budget guard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from gepa.core.result import GEPAResult

from dspy_pxn.schedules.asynchronous import AsyncSchedule
from dspy_pxn.schedules.parts import GepaParts, gepa_parts
from dspy_pxn.schedules.steps import StepSchedule

if TYPE_CHECKING:  # types only: the run imports the schedules, never the other way round
    from dspy_pxn.engine.run import Live, Run


class Schedule(Protocol):
    """Searches a prepared run on its live parts and gepa's; returns what ``gepa.optimize`` returns."""

    def run(self, run: Run, live: Live, parts: GepaParts) -> GEPAResult: ...


SCHEDULES: dict[str, Schedule] = {"steps": StepSchedule, "async": AsyncSchedule}


def search(run: Run, live: Live) -> GEPAResult:
    """The run searched by its schedule (``run.schedule``), on gepa's parts built from the run's sampler
    (``Run.resources``), its arguments and its live pool, events and adapter."""
    settings = run.settings
    parts = gepa_parts(
        live.sampler, candidate_selection_strategy=settings.candidate_selection_strategy,
        selected_component=settings.component_selector, selection=run.selection, reflection_lm=run.reflection_lm,
        adapter=live.adapter, pool=live.pool, events=live.events, code_components=run.code_components)
    return SCHEDULES[run.schedule].run(run, live, parts)


__all__ = ["SCHEDULES", "AsyncSchedule", "Schedule", "StepSchedule", "search"]
