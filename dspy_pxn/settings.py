"""A BatchedGEPA's arguments, checked once when it is built: all a compile reads of the optimizer.

``Run.prepare`` and the schedules read the frozen ``Settings``, never the optimizer, so the compile does not reach
back into the teleprompter (nor into the attributes dspy.GEPA keeps for its own compile). What an argument left open
(``p="auto"``, the schedule, the selection) is decided per compile from the data and the pool (``dspy_pxn.engine.run``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

import dspy
from gepa.proposer.reflective_mutation.base import CandidateSelector

from dspy_pxn import checks, gepa_options
from dspy_pxn.engine.sampling import CANDIDATE_SELECTORS, component_selector
from dspy_pxn.engine.tracker import Tracker, chosen_tracker
from dspy_pxn.engine.width import AUTO
from dspy_pxn.ledger.limiter import LMCallLimiter, limiter_for
from dspy_pxn.pools import WorkerPool
from dspy_pxn.proposer import selection as selections
from dspy_pxn.targets.program import metrics


@dataclass(frozen=True)
class Settings:
    """One BatchedGEPA's arguments, as given and checked (None: left to the compile to decide)."""

    # What GEPA searches with
    metric: Callable[..., Any] | None  # None: the program's own ``program.metric``
    p: int | Literal["auto"]
    n: int
    selection: Any  # "all" | "best" | k | "merge" | "merge+best" | a gepa SelectionStrategy; None: with the width
    schedule: str | None  # "steps" | "async"; None: with the width
    reflection_minibatch_size: int | None  # None: chosen with the width (dspy_pxn.engine.run.search_width)
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

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> Settings:
        """BatchedGEPA's arguments (its signature's names, every one given or defaulted), checked: the one place
        they are read. Each field is the argument of its name, as given, except what is read out of another
        (``gepa_kwargs``' callbacks, stoppers, progress bar and reflection cap, gepa's sampling and selection
        strategies as ``p``, ``n`` and ``selection``) and what a default stands for (``auto="light"`` with no
        budget, said by ``budget_by_default``; ``max_concurrent_lm_calls`` as a limiter; ``use_mlflow`` as a
        tracker). Raises ``ValueError`` (``checks.ArgumentError``) naming the argument and the fix."""
        a = dict(arguments)
        options = gepa_options.read(a["gepa_kwargs"], a["p"], a["n"], a["selection"])
        if options.p != AUTO:
            checks.positive_int("p", options.p, "p is the number of parents sampled per step, e.g. p=8, or "
                                "p='auto' to fill the worker pool.")
        checks.positive_int("n", options.n, "n is the number of mutations drawn per parent, e.g. n=1.")
        checks.at_most_one_budget(a["auto"], a["max_full_evals"], a["max_metric_calls"])
        if a["metric"] is not None:
            metrics.arity(a["metric"])  # a wrong signature fails here, before any data or LM
        checks.positive_int("num_threads", a["num_threads"], "It is the number of concurrent rollouts, e.g. 16.",
                            or_none=True)
        checks.positive_int("reflection_minibatch_size", a["reflection_minibatch_size"], or_none=True)
        selector = a["candidate_selection_strategy"]
        if isinstance(selector, str) and selector not in CANDIDATE_SELECTORS:
            raise ValueError(f"candidate_selection_strategy={selector!r} is unknown; use one of "
                             f"{sorted(CANDIDATE_SELECTORS)} or a gepa CandidateSelector.")
        if a["track_best_outputs"] and not a["track_stats"]:
            raise checks.ArgumentError("track_best_outputs=True needs track_stats=True (the outputs are part of the "
                                       "stats).")
        component_selector(a["component_selector"])  # an unknown name fails now, not at compile
        if a["use_wandb"]:
            checks.wandb_installed()
        if a["reflection_lm"] is None and a["instruction_proposer"] is None and dspy.settings.lm is None:
            raise checks.ArgumentError("No reflection LM: pass reflection_lm=dspy.LM('openai/gpt-5-mini', ...) or "
                                       "configure a default with dspy.configure(lm=...) before creating BatchedGEPA.")
        if isinstance(a["pool"], str) and a["pool"] != "ray":
            raise ValueError(f"pool={a['pool']!r} is not understood: pass 'ray', a WorkerPool instance, or None for "
                             "threads.")
        rest = checks.saved_state_serializable(a["log_dir"], a["track_best_outputs"], options.rest)
        no_budget = a["auto"] is None and a["max_full_evals"] is None and a["max_metric_calls"] is None
        schedule = a["schedule"]
        return cls(
            **{name: a[name] for name in _AS_GIVEN}, p=options.p, n=options.n,
            # None: chosen with the width (dspy_pxn.engine.run.search_plan), which p="auto" knows only at compile.
            selection=selections.checked(options.selection) if options.selection is not None else None,
            schedule=checks.schedule(schedule, use_wandb=a["use_wandb"], loop_only=checks.loop_only_gepa_kwargs(rest))
            if schedule is not None else None,
            auto="light" if no_budget else a["auto"], budget_by_default=no_budget,
            max_cost_usd=checks.positive_number("max_cost_usd", a["max_cost_usd"], "It is dollars, e.g. 5.0."),
            max_reflection_cost_usd=checks.positive_number(
                "gepa_kwargs['max_reflection_cost']", options.max_reflection_cost_usd, "It is dollars, e.g. 1.0."),
            max_wall_s=checks.positive_number("max_wall_s", a["max_wall_s"], "It is seconds, e.g. 3600."),
            lm_limiter=limiter_for(a["max_concurrent_lm_calls"]),
            display_progress_bar=options.display_progress_bar, gepa_kwargs=MappingProxyType(rest),
            callbacks=options.callbacks, stop_callbacks=options.stop_callbacks,
            tracker=chosen_tracker(a["tracker"], a["use_mlflow"]),
        )


# The fields that are their argument, as given.
_AS_GIVEN = (
    "metric", "reflection_minibatch_size", "candidate_selection_strategy", "component_selector", "use_merge",
    "max_merge_invocations", "skip_perfect_score", "perfect_score", "failure_score", "add_format_failure_as_feedback",
    "seed", "max_full_evals", "max_metric_calls", "reflection_lm", "instruction_proposer", "code_proposer",
    "warn_on_score_mismatch", "num_threads", "pool", "log_dir", "track_stats", "track_best_outputs", "use_wandb",
    "wandb_api_key", "wandb_init_kwargs",
)
