"""BatchedGEPA: dspy.GEPA with P×N proposals per step, one worker pool, an exact budget.

A compile is one story, each line a module (``compile`` below; ``dspy_pxn.engine.run`` tells each move). Two choices
shape the search, ``schedule`` (``dspy_pxn.schedules``) and ``selection`` (``dspy_pxn.proposer.selection``; the
*sibling merge* is ``dspy_pxn.proposer.sibling_merge``), chosen with the width when left open
(``dspy_pxn.engine.run.search_plan``). gepa's own ``use_merge=True`` is a different thing, the *crossover* in this
package. Tracking is a ``Tracker`` handed in (``dspy_pxn.engine.tracker``): this module does not know MLflow.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any, Literal

import dspy
from dspy.primitives import Example, Module
from gepa.proposer.reflective_mutation.base import CandidateSelector
from gepa.strategies.proposal_selection import SelectionStrategy

from dspy_pxn import checks
from dspy_pxn.engine.run import Run
from dspy_pxn.engine.tracker import Tracker
from dspy_pxn.engine.width import AUTO
from dspy_pxn.ledger.limiter import LMCallLimiter
from dspy_pxn.pools import WorkerPool
from dspy_pxn.schedules import search
from dspy_pxn.settings import Settings
from dspy_pxn.targets.program.target import ProgramTarget

logger = logging.getLogger(__name__)

class BatchedGEPA(dspy.GEPA):
    """dspy.GEPA with P×N proposals per step, one worker pool for every rollout, and an exact budget.

    Every argument of ``dspy.GEPA`` is accepted with its meaning and its default (``metric`` may be
    omitted, and ``track_stats`` is on). Changing only the class name of a dspy.GEPA call runs P×N
    proposals at the concurrency that call already had (``num_threads``, or DSPy's setting), the
    crossover included, within the same budget. With ``p=1, n=1`` the run proposes the same
    candidates as dspy.GEPA for the same seed and a deterministic LM, stopping at the last step
    that fits the budget instead of overshooting it.

    Args:
        metric: GEPA's feedback metric ``(gold, pred, trace=None, pred_name=None, pred_trace=None)``,
            returning a score (any real number: float, int, bool, a numpy scalar) or
            ``dspy.Prediction(score=..., feedback=...)``; a plain DSPy metric ``(gold, pred, trace=None)``
            works too (its feedback is the score alone). Default: the program's own ``program.metric``,
            which every ready-made program carries.
        p: Parents per step, distinct whenever the Pareto front has that many. Default ``"auto"``: P·N
            follows the pool, one proposal in flight per worker, fewer where the budget would then buy
            under six validation windows (``dspy_pxn.engine.width``): the metric-call budget, or where
            ``max_cost_usd`` binds first, the calls its dollars buy at the cost per call measured so far; the run
            says what it chose. Where that comes to one proposal, the run is dspy.GEPA's own loop.
            ``p=1, n=1``: dspy.GEPA's search.
        n: Mutations drawn per parent, each on its own minibatch. Default 1. Prefer more parents
            (``p``) to more mutations; ``n`` helps when the front holds only a few candidates.
        auto: dspy.GEPA's budget presets, ``"light"``, ``"medium"`` or ``"heavy"``: the number of metric
            calls dspy.GEPA's ``auto`` gives for the same program and valset (its own formula), spent
            exactly. Default: ``"light"`` when no budget is given (the run says the number it comes to).
        max_full_evals: The budget as a number of full passes over train + val. Give at most one of
            ``auto``, ``max_full_evals`` and ``max_metric_calls``.
        max_metric_calls: The budget in metric calls (one program run on one example, scored),
            never exceeded. A budget that cannot pay for one step (2·|val| + 2·minibatch) validates the
            seed and returns it, with a warning naming the smallest budget that buys a step.
        reflection_lm: The LM that rewrites instructions. Default: the task LM at compile time (the
            run says so); a stronger, slower model usually finds better instructions.
        num_threads: W, the one pool every rollout shares: never more rollouts in flight than this.
            Default: ``dspy.settings.num_threads``, as dspy.GEPA. Set it to the concurrency your
            provider allows; cap LM calls separately with ``max_concurrent_lm_calls``.
        selection: Which improving children are fully validated: ``"all"`` (the paper's AllImprovements),
            ``"best"``, an int k (the top k), ``"merge"`` (their lessons merged into the pool's best candidate
            by one reflection call, the sibling merge), ``"merge+best"`` (that merge and the best child), or a
            gepa ``SelectionStrategy``. Default: ``"all"`` at one proposal per step (dspy.GEPA's), ``"merge"``
            above it, which keeps held-out quality at width; ``"all"`` is faster and shallower.
        reflection_minibatch_size: Training examples each parent and child is screened on (m), all of
            which the reflection reads; each proposal costs 2·m metric calls. Default: 3 at one proposal
            at a time (dspy.GEPA's); above it, up to 8, in stages: a child is screened on the 3 examples
            its parent's reflection read, as in dspy.GEPA, and on the other 5 only if it beat its parent on
            those (the async schedule; gepa's step loop screens on 8, of which reflection reads the 3
            lowest-scoring). Several proposals merged into one validated candidate validate less often than
            dspy.GEPA does; the calls saved buy a steadier accept decision rather than more reflection calls
            (``dspy_pxn.engine.width.screening_minibatch``). Give it to set both.
        candidate_selection_strategy: How parents are drawn: ``"pareto"`` (default), ``"current_best"``,
            ``"epsilon_greedy"``, ``"top_k_pareto"``, or a gepa ``CandidateSelector``.
        component_selector: Which components a reflection rewrites: ``"round_robin"`` (default, one
            at a time), ``"all"``, or a gepa ``ReflectionComponentSelector`` or function.
        use_merge: gepa's crossover (two candidates' components recombined), as in dspy.GEPA: it is
            tried after a new candidate joins the pool, in a step of its own in the step loop, and
            beside the proposals in flight in the asynchronous one. Default True, as in dspy.GEPA.
        max_merge_invocations: Crossovers per run (with ``use_merge``). Default 5. The asynchronous
            schedule accepts at most this many; gepa's step loop (and so dspy.GEPA) stops scheduling new
            ones after this many are accepted, and may accept a few more that were already owed.
        skip_perfect_score: Skip reflecting on a parent already perfect on its minibatch. Default True.
        add_format_failure_as_feedback: Show output-format failures to the reflection LM as feedback.
            Default False, as in dspy.GEPA.
        instruction_proposer: A custom proposer of new instructions (dspy.GEPA's
            ``ProposalFn``); it runs on the driver, where it may keep state. Default: dspy's own.
        code_proposer: A custom proposer of ``dspy.Flex`` source. Default: dspy's own.
        failure_score: The score of a rollout that fails (a program or metric error). Default 0.0.
        perfect_score: The best score your metric gives, for ``skip_perfect_score``. Default 1.0.
        log_dir: A directory for gepa's state, the step log (``steps.jsonl``) and run files. Give
            one to resume a run after a crash by compiling again with the same ``log_dir``.
        track_stats: Attach ``detailed_results`` (a ``BatchedGEPAResult``) to the returned program. Default True.
        use_wandb: Log to Weights & Biases through gepa's own logging (needs ``wandb`` and the step
            schedule, chosen for you).
        wandb_api_key: Passed on to gepa's Weights & Biases logging.
        wandb_init_kwargs: Passed on to gepa's Weights & Biases logging.
        track_best_outputs: Keep the best outputs per validation example in the results (needs
            ``track_stats``). Default False.
        warn_on_score_mismatch: Warn when a metric's score for a predictor differs from its score
            for the program, as dspy.GEPA does. Default True.
        use_mlflow: Track each compile as an MLflow run (dspy-pxn's tracking, not gepa's), in MLflow's
            tracking URI and the ``dspy-pxn`` experiment; ``tracker=`` chooses them. Default False.
        seed: Seeds parent selection and minibatch sampling. Default 0. The step schedule is
            deterministic for a seed and a deterministic LM; the async one is not.
        gepa_kwargs: More ``gepa.optimize`` arguments, as under dspy.GEPA: ``callbacks`` (gepa callbacks,
            told what gepa's engine tells them under either schedule; one with ``on_step_record(record)``
            also hears each ``StepRecord`` as it is written), ``stop_callbacks``, ``max_reflection_cost``
            (dollars the reflection LM may spend, sibling merges included), ``display_progress_bar``,
            ``cache_evaluation`` (which needs the step schedule, chosen for you). Its strategies
            (sampling, selection, reflection, batch sampler, budget) are BatchedGEPA's arguments.
        pool: Where rollouts run: a ``WorkerPool`` you own (left open), ``"ray"`` for a
            ``RayWorkerPool`` of ``num_threads`` slots on the cluster at ``RAY_ADDRESS``, or None for
            a thread pool of ``num_threads`` (default). A pool made by a compile is closed by it.
        tracker: A ``dspy_pxn.engine.tracker.Tracker`` that follows each compile, e.g.
            ``dspy_pxn.tracking.MlflowTracker(experiment="hover", registered_model_name="hover")``; False
            keeps this run out of an enclosing ``sweep``. Default: tracked only inside a sweep, or in
            MLflow with ``use_mlflow=True``. Tracking never stops the search.
        max_concurrent_lm_calls: At most this many LM calls in progress at once, over the task,
            per-predictor and reflection LMs, whatever ``num_threads`` is (providers limit requests,
            not workers); an ``LMCallLimiter`` shares one cap between runs. Default: no cap. Calls,
            retries and failures are counted either way (``detailed_results.lm_call_counts``).
        schedule: ``"steps"`` (gepa's step loop: each step waits for its slowest call) or ``"async"``
            (P·N proposal pipelines always in flight, no step barrier). Default: ``"async"`` above
            one proposal per step, unless ``use_wandb`` or ``gepa_kwargs`` that only gepa's loop
            reads are given; ``"steps"`` at one.
        max_cost_usd: Dollars the search may spend on LM calls, task and reflection together; the run never
            spends more (each call's worst case is reserved before it is made, the ``max_tokens`` of every
            priced LM bounds it) and returns the best program found when the next piece of work does not fit.
            Whichever budget binds first ends the run (``detailed_results.stopped_by``). Needs every LM's
            price in the price map DSPy ships (a copy of litellm's), or registered with
            ``litellm.register_model``; models served on localhost cost 0. Default: no cap.
        max_wall_s: A deadline, in seconds from the start of the search: no work is started that the
            run's measured latencies say cannot finish in time, no LM call is made after it, and the best
            program found is returned (within about one call's latency of the deadline). Default: none.

    Raises:
        ValueError: An argument that cannot work, named with the fix (also an ``AssertionError``
            where dspy.GEPA raises one, so code written for dspy.GEPA keeps catching it).
    """

    def __init__(
        self,
        metric: Callable[..., Any] | None = None,
        *,
        p: int | Literal["auto"] = AUTO,
        n: int = 1,
        auto: Literal["light", "medium", "heavy"] | None = None,
        max_full_evals: int | None = None,
        max_metric_calls: int | None = None,
        reflection_lm: dspy.BaseLM | None = None,
        num_threads: int | None = None,
        selection: str | int | SelectionStrategy | None = None,
        reflection_minibatch_size: int | None = None,
        candidate_selection_strategy: str | CandidateSelector = "pareto",
        component_selector: Any = "round_robin",
        use_merge: bool = True,
        max_merge_invocations: int | None = 5,
        skip_perfect_score: bool = True,
        add_format_failure_as_feedback: bool = False,
        instruction_proposer: Any = None,
        code_proposer: Any = None,
        failure_score: float = 0.0,
        perfect_score: float = 1.0,
        log_dir: str | None = None,
        track_stats: bool = True,
        use_wandb: bool = False,
        wandb_api_key: str | None = None,
        wandb_init_kwargs: dict[str, Any] | None = None,
        track_best_outputs: bool = False,
        warn_on_score_mismatch: bool = True,
        use_mlflow: bool = False,
        seed: int | None = 0,
        gepa_kwargs: dict[str, Any] | None = None,
        pool: WorkerPool | str | None = None,
        tracker: Tracker | Literal[False] | None = None,
        max_concurrent_lm_calls: int | LMCallLimiter | None = None,
        schedule: Literal["steps", "async"] | None = None,
        max_cost_usd: float | None = None,
        max_wall_s: float | None = None,
    ):
        arguments = {name: value for name, value in locals().items() if name in PARAMETERS}  # first: only these
        self.settings = Settings.of(arguments)
        # dspy.GEPA's own attributes, for code that reads them, each holding what was passed; the compile reads
        # ``settings`` only. dspy.GEPA's __init__ checks its metric's arity and refuses what BatchedGEPA takes (a
        # plain metric, gepa's reflection cap): it gets what it accepts, and the attributes are set after it.
        super().__init__(**{
            **{name: arguments[name] for name in DSPY_GEPA_ARGUMENTS}, "metric": _resolved_in_compile,
            "auto": self.settings.auto, "reflection_lm": arguments["reflection_lm"] or dspy.settings.lm,
            "gepa_kwargs": dict(self.settings.gepa_kwargs)})
        for name in DSPY_GEPA_ARGUMENTS:  # (an argument left at None keeps what dspy.GEPA made of it: auto="light")
            if arguments[name] is not None:
                setattr(self, DSPY_GEPA_ATTRIBUTES.get(name, name), arguments[name])

    def compile(
        self,
        student: Module,
        *,
        trainset: list[Example],
        teacher: Module | None = None,
        valset: list[Example] | None = None,
        testset: list[Example] | None = None,
    ) -> Module:
        """Optimize ``student`` and return the best program found.

        Args:
            student: The DSPy program to optimize; its instructions (and any ``dspy.Flex`` source) are
                what GEPA rewrites. It is not modified.
            trainset: Examples the reflection learns from (minibatches), with their inputs marked
                (``dspy.Example(...).with_inputs(...)``).
            teacher: Not supported by GEPA; must be None.
            valset: Examples every accepted candidate is scored on. Default: the trainset (with a
                warning: scores are then optimistic).
            testset: Held-out examples the best program is scored on once after the search, on the same
                pool, never seen by it (``detailed_results.test_score``). Default: none.

        Returns:
            The best candidate as a program of the student's class, with ``detailed_results`` (a
            ``BatchedGEPAResult``) when ``track_stats``.

        Raises:
            ValueError: Bad input, before any LM call: data, metric or ``log_dir``.
            Exception: The program's own exception, when the seed program raises on nearly every
                validation example (a broken program, not a prompt to optimize).
        """
        if teacher is not None:
            raise checks.ArgumentError("teacher is not supported by GEPA; pass teacher=None.")
        testset = checks.dataset("testset", testset) if testset is not None else None
        try:
            target = ProgramTarget.of(self.settings, student)
            run = Run.prepare(self.settings, target, trainset, valset, testset)
        except checks.BudgetBuysNoValidation as nothing:
            logger.warning("%s", nothing)
            return student.deepcopy()
        with run.resources() as live:
            gepa_result = search(run, live)
            return target.result(run, gepa_result, live, run.ended(gepa_result, live))


# The arguments BatchedGEPA shares with dspy.GEPA, and the attribute dspy.GEPA keeps each under where it is not
# the argument's name.
DSPY_GEPA_ARGUMENTS = tuple(name for name in inspect.signature(dspy.GEPA.__init__).parameters if name != "self")
DSPY_GEPA_ATTRIBUTES = {"metric": "metric_fn", "instruction_proposer": "custom_instruction_proposer",
                        "code_proposer": "custom_code_proposer"}
# Each argument's default: ``Settings.of({**DEFAULTS, **given})`` is what ``BatchedGEPA(**given)`` keeps.
DEFAULTS = {name: parameter.default for name, parameter in inspect.signature(BatchedGEPA.__init__).parameters.items()
            if name != "self"}
PARAMETERS = tuple(DEFAULTS)


def _resolved_in_compile(gold, pred, trace=None, pred_name=None, pred_trace=None):  # pragma: no cover
    """Stands in for dspy.GEPA's metric argument: compile resolves the run's metric (dspy_pxn.targets.program.metrics)."""
    raise AssertionError("BatchedGEPA resolves its metric in compile()")
