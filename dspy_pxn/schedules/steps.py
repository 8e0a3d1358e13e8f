"""``schedule="steps"``: gepa's own step loop, P×N wide, with dspy-pxn's strategies in its extension points.

    sampling    DistinctParentsPxN          P distinct parents × N mutations, narrowed by the budget
    minibatches SequentialMinibatchSampler  a fresh minibatch for every task
    reflection  PooledReflection            all P·N reflection calls at once
    adapter     BatchedAdapter              every rollout of a step on one pool of W workers
    selection   BudgetCappedSelection       all | best | top-k | sibling merge, never validating past the budget
    stopper     ExactBudgetStopper          stop when no useful step fits the budget

At P = N = 1 this is dspy.GEPA's run, candidate for candidate (``tests/test_batched_gepa.py``).
"""

from __future__ import annotations

import logging

import gepa
from dspy.teleprompt.gepa.gepa_utils import LoggerAdapter
from gepa.core.result import GEPAResult

from dspy_pxn.run import Live, Run
from dspy_pxn.schedules.parts import GepaParts
from dspy_pxn.strategies import DistinctParentsPxN, ExactBudgetStopper

logger = logging.getLogger(__name__)


class StepSchedule:
    """Runs the search as ``gepa.optimize``; every step waits for its slowest rollout."""

    @staticmethod
    def run(run: Run, live: Live) -> GEPAResult:
        optimizer, parts = run.optimizer, GepaParts.of(run, live)
        # gepa's loop does not say which evaluations are the parents' or which phase a step is in:
        # the adapter follows the step's events.
        live.events.add(live.adapter)
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
            stop_callbacks=[ExactBudgetStopper(run.guard)],
            callbacks=[live.recorder, *live.gepa_callbacks],
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
