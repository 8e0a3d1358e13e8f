"""A BatchedGEPA's arguments, checked once when it is built: all a compile reads of the optimizer.

``BatchedGEPA.__init__`` turns its arguments into one frozen ``Settings``; ``Run.prepare`` and the
schedules read it, never the optimizer, so the compile does not reach back into the teleprompter
(nor into the attributes dspy.GEPA keeps for its own compile). What an argument left open (``p="auto"``,
the schedule, the selection) is decided per compile from the data and the pool, in ``dspy_pxn.run``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import dspy
from gepa.proposer.reflective_mutation.base import CandidateSelector

from dspy_pxn.ledger.limiter import LMCallLimiter
from dspy_pxn.pools import WorkerPool
from dspy_pxn.tracker import Tracker


@dataclass(frozen=True)
class Settings:
    """One BatchedGEPA's arguments, as given and checked (None: left to the compile to decide)."""

    # What GEPA searches with
    metric: Callable[..., Any] | None  # None: the program's own ``program.metric``
    p: int | Literal["auto"]
    n: int
    selection: Any  # "all" | "best" | k | "merge" | "merge+best" | a gepa SelectionStrategy; None: with the width
    schedule: str | None  # "steps" | "async"; None: with the width
    reflection_minibatch_size: int | None  # None: chosen with the width (dspy_pxn.run.search_width)
    candidate_selection_strategy: str | CandidateSelector
    component_selector: Any
    use_merge: bool  # gepa's crossover
    max_merge_invocations: int
    skip_perfect_score: bool
    perfect_score: float
    failure_score: float
    add_format_failure_as_feedback: bool
    seed: int | None
    # How much it may spend
    auto: str | None
    budget_by_default: bool  # no budget was given: auto="light" was chosen, which the run says
    max_full_evals: int | None
    max_metric_calls: int | None
    max_cost_usd: float | None
    max_reflection_cost_usd: float | None
    max_wall_s: float | None
    # Who reflects
    reflection_lm: dspy.BaseLM | None  # None: the task LM at compile time
    instruction_proposer: Any
    code_proposer: Any
    warn_on_score_mismatch: bool
    # Where it runs, and who hears of it
    num_threads: int | None  # None: DSPy's num_threads setting at compile time
    pool: WorkerPool | str | None
    lm_limiter: LMCallLimiter | None
    log_dir: str | None
    track_stats: bool
    track_best_outputs: bool
    use_wandb: bool
    wandb_api_key: str | None
    wandb_init_kwargs: Mapping[str, Any] | None
    display_progress_bar: bool
    gepa_kwargs: Mapping[str, Any]  # what goes on to gepa.optimize as it is
    callbacks: tuple[Any, ...]  # gepa callbacks; those with ``on_step_record`` hear every StepRecord
    stop_callbacks: tuple[Any, ...]
    tracker: Tracker | Literal[False] | None  # False: none, not even an enclosing sweep's; None: a sweep's
