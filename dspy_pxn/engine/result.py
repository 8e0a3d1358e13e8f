"""What a compile returns beside the program: dspy.GEPA's detailed results, and the run's own record."""

from __future__ import annotations

from dataclasses import dataclass, field

from dspy.teleprompt.gepa.gepa import DspyGEPAResult

from dspy_pxn.engine.records import StepRecord
from dspy_pxn.ledger.ledger import LMCallCounts, UsageTotals


@dataclass(frozen=True)
class BatchedGEPAResult(DspyGEPAResult):
    """dspy.GEPA's detailed results (``program.detailed_results``), plus the run's own record.

    Everything of dspy's ``DspyGEPAResult`` is here: ``candidates`` (programs), ``parents``,
    ``val_aggregate_scores``, ``val_subscores``, ``best_idx``, ``total_metric_calls``, ...

    Attributes:
        steps: One ``StepRecord`` per step (per validation window with ``schedule="async"``).
        budget: The run's budget in metric calls.
        num_workers: W, the pool's size.
        wall_s: The search's wall-clock, without the held-out evaluation.
        test_score: The best program's mean score on ``testset``, or None without one.
        usage: LM calls, tokens and dollars of the search (``UsageTotals``), and the same of the task and of
            reflection (``usage.task``, ``usage.reflection``).
        mlflow_run_id: The tracked run's id, or None when the run was not tracked.
        lm_call_counts: LM calls, attempts, retries and failures of the search (``LMCallCounts``;
            attempts and retries are None where DSPy does not tell them). Both tell what the last step
            record tells: an async run may return with reflections in flight whose children no budget is
            left to validate; those calls are ``abandoned``, in no other count (``dspy_pxn.ledger``).
        stopped_by: The budget that ended the search: ``"max_metric_calls"`` (no useful step fitted),
            ``"auto"`` (the proposals its level states were made), ``"max_cost_usd"``,
            ``"max_reflection_cost"`` or ``"max_wall_s"``.
    """

    steps: tuple[StepRecord, ...] = ()
    budget: int = 0
    num_workers: int = 0
    wall_s: float = 0.0  # the search; the test evaluation is not included
    test_score: float | None = None
    usage: UsageTotals = field(default_factory=UsageTotals)  # LM calls, tokens and dollars of the search
    mlflow_run_id: str | None = None  # the tracked run's id, whatever the tracker (kept for MLflow users)
    lm_call_counts: LMCallCounts = field(default_factory=LMCallCounts)  # LM calls, retries, failures
    stopped_by: str = "max_metric_calls"
