"""``schedule="steps"``: gepa's own step loop, P×N wide, with dspy-pxn's strategies in its extension points.

    sampling    DistinctParentsPxN          P distinct parents × N mutations, narrowed by the budget
    minibatches SequentialMinibatchSampler  a fresh minibatch for every task
    reflection  PooledReflection            all P·N reflection calls at once
    adapter     PooledAdapter               every rollout of a step on one pool of W workers
    selection   BudgetCappedSelection       all | best | top-k | sibling merge, never validating past the budget
    stopper     ExactBudgetStopper          stop when no useful step fits the budget
                CapsStopper                 ... or the dollars and deadline (max_cost_usd, max_wall_s)

A cap that refuses an LM call mid-step (``ledger.caps.CapReached``) ends gepa's loop by raising through
it; the state gepa was driving is then the result, as if its loop had stopped there.

At P = N = 1 this is dspy.GEPA's run, candidate for candidate (``tests/test_batched_gepa.py``), the
crossover included: gepa.optimize draws parents, minibatches and crossovers from one random generator
it makes itself, so the run's parent selector is gepa's (named, not built here) and its minibatches
draw from that selector's generator (``OnGepasGenerator``).
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any

import gepa
from dspy.teleprompt.gepa.gepa_utils import LoggerAdapter
from gepa.core.result import GEPAResult
from gepa.core.state import GEPAState

from dspy_pxn.engine.pooled_adapter import PooledAdapter
from dspy_pxn.ledger.caps import CapReached, seed_validation_paid
from dspy_pxn.schedules.parts import GepaParts, degraded
from dspy_pxn.schedules.strategies import (
    BudgetCappedSelection,
    CapsStopper,
    DistinctParentsPxN,
    ExactBudgetStopper,
    stopper_telling,
)

if TYPE_CHECKING:  # types only: the run imports the schedules, never the other way round
    from dspy_pxn.engine.run import Live, Run

logger = logging.getLogger(__name__)


class StepSchedule:
    """Runs the search as ``gepa.optimize``; every step waits for its slowest rollout."""

    @staticmethod
    def run(run: Run, live: Live, parts: GepaParts) -> GEPAResult:
        settings = run.settings
        crossover = CrossoverDue(settings.max_merge_invocations)
        stoppers: list[Any] = [ExactBudgetStopper(run.guard, live.ledger, crossover.due),
                               *(stopper_telling(live.ledger, stopper) for stopper in settings.stop_callbacks)]
        if live.caps is not None:
            stoppers.append(CapsStopper(live.caps, run.guard, run.p * run.n, live.pool.num_workers))
        driven = StateDriven()
        selector = settings.candidate_selection_strategy  # a name: gepa builds it on its own generator
        sampling = DistinctParentsPxN(run.p, run.n, run.guard, live.events, one_at_a_time=lambda: degraded(parts))
        # gepa's loop does not say which evaluations are the parents' or which phase a step is in: its sampling tells
        # the adapter a step's screening starts (the parents' minibatches to trace), its selection that validation does.
        try:
            return gepa.optimize(
                seed_candidate=run.seed_candidate,
                trainset=run.trainset,
                valset=run.valset,
                adapter=live.adapter,
                candidate_selection_strategy=selector if isinstance(selector, str) else parts.candidate_selector,
                batch_sampler=parts.sampler,
                sampling_strategy=OnGepasGenerator(sampling, parts, live.adapter),
                selection_strategy=BudgetCappedSelection(parts.selection, run.guard, live.events,
                                                         validating=live.adapter.validating),
                reflection_strategy=parts.reflection,
                stop_callbacks=stoppers,
                callbacks=[driven, crossover, live.recorder, *live.gepa_callbacks],
                skip_perfect_score=settings.skip_perfect_score,
                perfect_score=settings.perfect_score,
                module_selector=parts.component_selector,
                use_merge=settings.use_merge,
                max_merge_invocations=settings.max_merge_invocations,
                logger=LoggerAdapter(logger),
                run_dir=settings.log_dir,
                use_wandb=settings.use_wandb,
                wandb_api_key=settings.wandb_api_key,
                wandb_init_kwargs=settings.wandb_init_kwargs,
                track_best_outputs=settings.track_best_outputs,
                display_progress_bar=settings.display_progress_bar,
                raise_on_exception=True,
                seed=settings.seed,
                **settings.gepa_kwargs,
            )
        except CapReached as reached:
            state = driven.state
            if state is None:  # gepa was still scoring the seed
                with seed_validation_paid():
                    raise reached from None
            # gepa's state where a cap stopped its loop, saved (for resume) and read as gepa reads it.
            state.adapter_state = dict(live.adapter.get_adapter_state())
            state.save(settings.log_dir, use_cloudpickle=bool(settings.gepa_kwargs.get("use_cloudpickle")))
            return GEPAResult.from_state(state, run_dir=settings.log_dir, seed=settings.seed)


class OnGepasGenerator:
    """The step loop's sampling, drawing from gepa's own random generator; it tells the adapter each step's screening
    starts, with the parents' minibatches to trace (``PooledAdapter.screening``).

    gepa.optimize hands one generator to the parent selector it builds from a name, to its minibatch
    sampler and to its crossover (``MergeProposer``), so in dspy.GEPA a crossover's draws move the parents
    and minibatches that follow. The run's sampler is dspy-pxn's, so before the first draw it moves onto
    the selector's generator, which takes the state of the run's own (a resumed run's, restored from its
    checkpoint); the checkpoint saves the sampler's generator, so from then on that one. A selector without
    a generator (``"current_best"``, one passed in) leaves the sampler on the run's.
    """

    def __init__(self, sampling: DistinctParentsPxN, parts: GepaParts, adapter: PooledAdapter):
        self.sampling, self.parts, self.adapter, self.moved = sampling, parts, adapter, False

    def sample_tasks(self, state: GEPAState, candidate_selector: Any, batch_sampler: Any, trainset: Any) -> list:
        if not self.moved:
            self.moved = True
            gepas = getattr(candidate_selector, "rng", None)
            if isinstance(gepas, random.Random) and gepas is not self.parts.rng:
                gepas.setstate(self.parts.rng.getstate())
                batch_sampler.rng = gepas
        tasks = self.sampling.sample_tasks(state, candidate_selector, batch_sampler, trainset)
        self.adapter.screening(tasks)
        return tasks


class CrossoverDue:
    """Whether gepa's loop tries a crossover next (``use_merge``), heard through its callbacks, so the budget
    stopper reserves a crossover's calls only when one may take the next step.

    gepa's ``MergeProposer`` keeps this to itself: a crossover is due after an iteration that accepted a
    reflective candidate, while fewer than ``max_merge_invocations`` crossovers were accepted, once per
    candidate accepted; each iteration clears the "after" whether it tries one or not.
    """

    def __init__(self, max_merge_invocations: int):
        self.max_merge_invocations = max_merge_invocations
        self.owed = self.accepted = 0
        self.found_last_iteration = self.crossing = False

    def due(self) -> bool:
        return self.owed > 0 and self.found_last_iteration

    def on_iteration_start(self, event: Any) -> None:
        self.found_last_iteration = self.crossing = False

    def on_merge_accepted(self, event: Any) -> None:
        self.crossing = True  # gepa tells the crossover's candidate accepted next: not a reflective one
        self.owed -= 1
        self.accepted += 1

    def on_candidate_accepted(self, event: Any) -> None:
        if self.crossing:
            return
        self.found_last_iteration = True
        if self.accepted < self.max_merge_invocations:
            self.owed += 1


class StateDriven:
    """A gepa callback that keeps the state gepa's loop drives, for a run a cap stops mid-step."""

    def __init__(self) -> None:
        self.state: GEPAState | None = None

    def on_iteration_start(self, event: Any) -> None:
        self.state = event["state"]
