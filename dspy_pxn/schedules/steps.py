"""``schedule="steps"``: gepa's own step loop, P×N wide, with dspy-pxn's strategies in its extension points.

    sampling    DistinctParentsPxN          P distinct parents × N mutations, narrowed by the budget
    minibatches SequentialMinibatchSampler  a fresh minibatch for every task
    reflection  PooledReflection            all P·N reflection calls at once
    adapter     BatchedAdapter              every rollout of a step on one pool of W workers
    selection   BudgetCappedSelection       all | best | top-k | sibling merge, never validating past the budget
    stopper     ExactBudgetStopper          stop when no useful step fits the budget
                CapsStopper                 ... or the dollars and deadline (max_cost_usd, max_wall_s)

A cap that refuses an LM call mid-step (``ledger.caps.CapReached``) ends gepa's loop by raising through
it; the state gepa was driving is then the result, as if its loop had stopped there.

At P = N = 1 this is dspy.GEPA's run, candidate for candidate (``tests/test_batched_gepa.py``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import gepa
from dspy.teleprompt.gepa.gepa_utils import LoggerAdapter
from gepa.core.result import GEPAResult
from gepa.core.state import GEPAState

from dspy_pxn.ledger.caps import CapReached, seed_validation_paid
from dspy_pxn.schedules.parts import GepaParts
from dspy_pxn.strategies import CapsStopper, DistinctParentsPxN, ExactBudgetStopper

if TYPE_CHECKING:  # types only: the run imports the schedules, never the other way round
    from dspy_pxn.run import Live, Run

logger = logging.getLogger(__name__)


class StepSchedule:
    """Runs the search as ``gepa.optimize``; every step waits for its slowest rollout."""

    @staticmethod
    def run(run: Run, live: Live) -> GEPAResult:
        optimizer, parts = run.optimizer, GepaParts.of(run, live)
        # gepa's loop does not say which evaluations are the parents' or which phase a step is in:
        # the adapter follows the step's events.
        live.events.add(live.adapter)
        stoppers: list[Any] = [ExactBudgetStopper(run.guard)]
        if live.caps is not None:
            stoppers.append(CapsStopper(live.caps, run.guard, run.p * run.n, live.pool.num_workers))
        driven = StateDriven()
        try:
            return gepa.optimize(
                seed_candidate=run.seed_candidate,
                trainset=run.trainset,
                valset=run.valset,
                adapter=live.adapter,
                candidate_selection_strategy=parts.candidate_selector,
                batch_sampler=parts.sampler,
                sampling_strategy=DistinctParentsPxN(run.p, run.n, run.guard, live.events),
                selection_strategy=parts.selection,
                reflection_strategy=parts.reflection,
                stop_callbacks=stoppers,
                callbacks=[driven, live.recorder, *live.gepa_callbacks],
                skip_perfect_score=optimizer.skip_perfect_score,
                perfect_score=optimizer.perfect_score,
                module_selector=parts.component_selector,
                use_merge=optimizer.use_merge,
                max_merge_invocations=optimizer.max_merge_invocations,
                logger=LoggerAdapter(logger),
                run_dir=optimizer.log_dir,
                use_wandb=optimizer.use_wandb,
                wandb_api_key=optimizer.wandb_api_key,
                wandb_init_kwargs=optimizer.wandb_init_kwargs,
                track_best_outputs=optimizer.track_best_outputs,
                display_progress_bar=optimizer.display_progress_bar,
                raise_on_exception=True,
                seed=optimizer.seed,
                **optimizer.gepa_kwargs,
            )
        except CapReached as reached:
            state = driven.state
            if state is None:  # gepa was still scoring the seed
                with seed_validation_paid():
                    raise reached from None
            # gepa's state where a cap stopped its loop, saved (for resume) and read as gepa reads it.
            state.adapter_state = dict(live.adapter.get_adapter_state())
            state.save(optimizer.log_dir, use_cloudpickle=bool(optimizer.gepa_kwargs.get("use_cloudpickle")))
            return GEPAResult.from_state(state, run_dir=optimizer.log_dir, seed=optimizer.seed)


class StateDriven:
    """A gepa callback that keeps the state gepa's loop drives, for a run a cap stops mid-step."""

    def __init__(self) -> None:
        self.state: GEPAState | None = None

    def on_iteration_start(self, event: Any) -> None:
        self.state = event["state"]
