"""StepRecord, the single per-step truth; the recorder that makes it and the log that keeps it.

Everything that reports on a run (the step log, MLflow, progress, the runtime model) reads these records, so they
carry what the paper's runtime model needs: width, acceptance, whether validation fired, where the time went.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from gepa.core.state import GEPAState
from gepa.strategies.proposal_sampling import ProposalTask

from dspy_pxn.engine.candidates import best_program, pareto_front_programs
from dspy_pxn.engine.events import Phase, StepListener, override
from dspy_pxn.ledger.budget import RunShape
from dspy_pxn.ledger.caps import RunCaps
from dspy_pxn.ledger.ledger import RunLedger, Tally, UsageTotals
from dspy_pxn.pools import WorkerPool

logger = logging.getLogger(__name__)

STEP_LOG_NAME = "steps.jsonl"


@dataclass(kw_only=True)
class BillByRole:
    """The bill split by who made the calls: the task LM (the program and its metric) and the reflection LM
    (reflections and sibling merges), as each provider counts it. A step's and a run's records both carry it."""

    task_lm_calls: int = 0
    task_prompt_tokens: int = 0
    task_completion_tokens: int = 0
    task_cost_usd: float | None = None
    reflection_lm_calls: int = 0
    reflection_prompt_tokens: int = 0
    reflection_completion_tokens: int = 0
    reflection_cost_usd: float | None = None


@dataclass
class StepRecord(BillByRole):
    """One step of a run (with ``schedule="async"``, one validation window). Seconds and validation averages.

    Attributes:
        step: gepa's iteration number, from 1; a resumed run continues the numbering.
        kind: ``"reflective"``, or ``"crossover"`` when gepa's crossover (``use_merge``) took the step.
        width: Proposal tasks sampled: P·N unless the budget narrowed the step (async: pipelines started).
        distinct_parents: Different parents among them.
        proposals: Children screened on their minibatch (async: pipelines that finished with a child).
        improved: Children that beat their parent on the minibatch (the selection may validate fewer).
        accepted: Candidates fully validated and added to the pool; ``new_candidates`` are their indices.
        metric_calls: Metric calls spent in this step; ``metric_calls_total`` in the run so far, of ``budget``.
        best_val: The best validation score in the pool after the step; ``mean_val`` the pool's mean.
        wall_s: The step's wall-clock. ``screening_s``, ``reflection_s``, ``validation_s`` and ``sibling_merge_s``
            are summed over the step's work, so with overlapping work (async) they may add up to more than it.
        rollouts: Rollouts run; ``rollout_failures`` of them scored as failures.
        reflection_failures: Reflection calls that proposed nothing.
        worker_utilisation: Busy worker-seconds over W × ``wall_s``.
        sibling_merged: Improving children merged into the validated candidate (``selection="merge"``).
        lm_calls: LM calls billed since the previous record (the first: since the run began, the seed's validation
            included; calls answered from DSPy's cache are not billed), with ``prompt_tokens``, ``completion_tokens``
            and ``cost_usd`` (None while no price is known); ``cost_usd_total`` is the run's so far. The records add up
            to the run's ``usage`` and ``lm_call_counts``. Split by who made the calls, as each provider bills them:
            ``task_lm_calls``, ``task_prompt_tokens``, ``task_completion_tokens``, ``task_cost_usd`` (the program, its
            metric); ``reflection_lm_calls``, ``reflection_prompt_tokens``, ``reflection_completion_tokens``,
            ``reflection_cost_usd`` (reflections and sibling merges).
        lm_retries: Requests sent again after a failed attempt (a 429, a 5xx, a timeout), None where DSPy does not
            tell them; ``lm_failures``: calls that failed after their last retry. The steps' retries add up to the
            run's (``lm_call_counts.retries``).
        schedule: ``"steps"`` or ``"async"``.
        cost_usd_left: Dollars left of ``max_cost_usd`` after the step (None without a dollar cap); ``wall_s_left``:
            seconds left before ``max_wall_s`` (None without a deadline).
        time_left_s: The estimated seconds until the first budget binds, at this run's pace so far (metric calls and
            dollars a second; the deadline's own seconds); ``time_left_budget`` names it.
    """

    step: int
    kind: str
    p: int
    n: int
    width: int
    distinct_parents: int
    proposals: int
    accepted: int
    full_validation: bool
    new_candidates: list[int]
    metric_calls: int
    metric_calls_total: int
    budget: int
    best_val: float
    mean_val: float
    pareto_front_size: int
    wall_s: float
    reflection_s: float
    screening_s: float
    validation_s: float
    rollouts: int
    rollout_failures: int
    reflection_failures: int
    worker_utilisation: float
    num_workers: int
    started_at: float = field(default=0.0)
    improved: int = 0
    minibatch_size: int = 0
    val_size: int = 0
    lm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    cost_usd_total: float | None = None
    lm_retries: int | None = 0
    lm_failures: int = 0
    sibling_merged: int = 0
    sibling_merge_s: float = 0.0
    schedule: str = "steps"  # one record per step of gepa's loop, or per validation window ("async")
    cost_usd_left: float | None = None
    wall_s_left: float | None = None
    time_left_s: float | None = None
    time_left_budget: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> StepRecord:
        return cls(**json.loads(line))

    def summary(self) -> str:
        """What the step did, in a user's words, e.g. '16 proposals screened (from 4 parents), 5 improved,
        1 validated (a merge of 5), best val 0.533'."""
        parts = [f"{_count(self.proposals, 'proposal')} screened"
                 + (f" (from {_count(self.distinct_parents, 'parent')})" if self.distinct_parents else "")]
        if self.improved:
            parts.append(f"{self.improved} improved")
        validated = f"{self.accepted} validated" if self.accepted else "none validated"
        if self.sibling_merged:
            validated += f" (a merge of {self.sibling_merged})"
        if self.kind == "crossover":
            validated += " (a crossover)"
        parts += [validated, f"best val {self.best_val:.3f}"]
        return ", ".join(parts)


def bill(step: UsageTotals, run: UsageTotals) -> dict[str, int | float | None]:
    """A StepRecord's bill fields: the step's calls, tokens and dollars of the task and of reflection (a role's
    dollars are 0.0 in a step without its calls once the run knows its price, None while it does not)."""
    fields = {}
    for role in ("task", "reflection"):
        mine, known = getattr(step, role), getattr(run, role).cost_usd is not None
        fields.update({f"{role}_lm_calls": mine.lm_calls, f"{role}_prompt_tokens": mine.prompt_tokens,
                       f"{role}_completion_tokens": mine.completion_tokens,
                       f"{role}_cost_usd": (mine.cost_usd or 0.0) if known else None})
    return fields


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


class StepLog:
    """The run's ``log_dir/steps.jsonl``, one record appended per line as each step ends: written first and by itself,
    so a run that dies keeps every finished step, and a resumed run can drop the one in flight (``keep_first``)."""

    def __init__(self, log_dir: str):
        self.path = os.path.join(log_dir, STEP_LOG_NAME)

    def __call__(self, record: StepRecord) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "a") as handle:
            handle.write(record.to_json() + "\n")

    def keep_first(self, completed_steps: int) -> list[StepRecord]:
        """Keep the records of the steps gepa's saved state includes; return them."""
        kept = [record for record in read_step_log(os.path.dirname(self.path)) if record.step <= completed_steps]
        with open(self.path + ".tmp", "w") as handle:
            handle.writelines(record.to_json() + "\n" for record in kept)
        os.replace(self.path + ".tmp", self.path)
        return kept


def read_step_log(log_dir: str) -> list[StepRecord]:
    """Load the records a run wrote to ``log_dir`` (one JSON object per line)."""
    path = os.path.join(log_dir, STEP_LOG_NAME)
    if not os.path.exists(path):
        return []
    with open(path) as handle:
        return [StepRecord.from_json(line) for line in handle if line.strip()]


class StepRecorder(StepListener):
    """Hears a run's step events and gepa's iteration callbacks; emits one StepRecord per step. Each evaluation's
    phase comes with its event (no guessing which ``batch_evaluate`` call is which), and counts add up over a step's
    events, so a schedule that samples one task at a time (async) records the same fields."""

    def __init__(self, p: int, n: int, shape: RunShape, pool: WorkerPool, ledger: RunLedger,
                 sinks: Sequence[Callable[[StepRecord], None]] = (), schedule: str = "steps",
                 caps: RunCaps | None = None):
        self.p, self.n, self.shape, self.schedule = p, n, shape, schedule
        self.pool, self.ledger, self.caps = pool, ledger, caps
        self.sinks = list(sinks)
        self.steps: list[StepRecord] = []
        self._lock = threading.Lock()
        self._recorded: Tally | None = None  # the ledger's tally at the last record
        self.start(None)

    # -- step events --------------------------------------------------------------
    @override
    def tasks_sampled(self, tasks: Sequence[ProposalTask]) -> None:
        with self._lock:
            self._width += len(tasks)
            self._parents.update(t.parent_idx for t in tasks)

    @override
    def children_screened(self, children: int, improved: int) -> None:
        with self._lock:
            self._proposals += children
            self._improved += improved

    @override
    def evaluated(self, phase: Phase, seconds: float, rollouts: int, failures: int) -> None:
        with self._lock:
            self._phase_s[phase] += seconds
            self._rollout_failures += failures

    @override
    def reflected(self, seconds: float, jobs: int, failed: int) -> None:
        with self._lock:
            self._phase_s["reflection"] += seconds
            self._reflection_failures += failed

    @override
    def sibling_merged(self, seconds: float, children: int) -> None:
        with self._lock:
            self._phase_s["sibling_merge"] += seconds
            self._sibling_merged += children

    # -- gepa's callbacks, in its step loop ----------------------------------------
    def on_iteration_start(self, event: dict) -> None:
        self.start(event["state"])

    def on_merge_attempted(self, event: dict) -> None:
        """gepa's crossover took this step over: its one crossed candidate is the step's proposal."""
        with self._lock:
            self._kind = "crossover"
            self._proposals += 1

    def on_candidate_accepted(self, event: dict) -> None:
        self.accepted(event["new_candidate_idx"])

    def on_iteration_end(self, event: dict) -> None:
        self.end(event["state"])

    # -- a step's bounds, as gepa's loop or another schedule reports them ------------
    def accepted(self, index: int) -> None:
        """Candidate ``index`` joined the pool in this step."""
        with self._lock:
            self._new.append(index)

    def calls_since_last_record(self) -> bool:
        """Whether an LM call ended or was billed after the last record: a schedule that ends with such calls and no
        step open (their events came too late to open one) writes one more record, so the last tells the run's usage."""
        if self._recorded is None:
            return False
        now = self.ledger.tally()
        return now.billed > self._recorded.billed or now.calls > self._recorded.calls

    def end(self, state: GEPAState) -> StepRecord:
        """The step is over: its record goes to ``steps`` and to every sink."""
        wall = self.ledger.elapsed() - self._t0
        busy = self.pool.busy_seconds() - self._busy0
        scores = state.program_full_scores_val_set
        total = self.ledger.tally()
        step = total.since(self._tally0)
        self._recorded = total
        usd_left = self.caps.usd_left() if self.caps is not None else None
        seconds_left = self.caps.seconds_left() if self.caps is not None else None
        time_left_s, time_left_budget = self.ledger.time_left(state.total_num_evals, self.shape.budget, usd_left,
                                                              seconds_left)
        phase_s, workers = self._phase_s, self.pool.num_workers
        record = StepRecord(
            step=state.i + 1,  # gepa's iteration number, so a resumed run continues the numbering
            kind=self._kind, p=self.p, n=self.n, width=self._width, distinct_parents=len(self._parents),
            proposals=self._proposals, improved=self._improved, accepted=len(self._new),
            full_validation=bool(self._new), new_candidates=list(self._new),
            metric_calls=state.total_num_evals - self._calls0, metric_calls_total=state.total_num_evals,
            budget=self.shape.budget, minibatch_size=self.shape.minibatch_size, val_size=self.shape.val_size,
            best_val=scores[best_program(state)], mean_val=sum(scores) / len(scores),
            pareto_front_size=len(pareto_front_programs(state)),
            wall_s=wall, started_at=self._started_at, reflection_s=phase_s["reflection"],
            screening_s=phase_s["screening"], validation_s=phase_s["validation"],
            sibling_merge_s=phase_s["sibling_merge"], sibling_merged=self._sibling_merged,
            rollouts=self.ledger.rollouts - self._rollouts0, rollout_failures=self._rollout_failures,
            reflection_failures=self._reflection_failures,
            worker_utilisation=busy / (workers * wall) if wall > 0 else 0.0, num_workers=workers,
            lm_calls=step.billed, prompt_tokens=step.prompt_tokens, completion_tokens=step.completion_tokens,
            cost_usd=step.task_usd + step.reflection_usd if total.cost_usd is not None else None,
            cost_usd_total=total.cost_usd, lm_failures=step.failures,
            lm_retries=step.counts.retries if total.counts.retries is not None else None,
            schedule=self.schedule, cost_usd_left=usd_left, wall_s_left=seconds_left,
            time_left_s=time_left_s, time_left_budget=time_left_budget,
            **bill(step.usage, total.usage),
        )
        self.steps.append(record)
        for sink in self.sinks:
            try:
                sink(record)
            except Exception as error:  # noqa: BLE001 - an observer must never stop the run
                logger.warning("Step sink %r failed: %s", sink, error)
        return record

    def start(self, state: GEPAState | None) -> None:
        """A step begins: everything heard from now on is its."""
        self._t0, self._started_at = self.ledger.elapsed(), self.ledger.now_epoch()  # the run's one clock
        self._busy0 = self.pool.busy_seconds()
        self._calls0 = state.total_num_evals if state is not None else 0
        if state is not None:
            self.ledger.steps_begin(state.total_num_evals)  # the seed's validation (or a resumed run's calls) before
        self._kind = "reflective"
        self._phase_s: defaultdict[str, float] = defaultdict(float)
        self._parents: set[int] = set()
        self._new: list[int] = []
        self._width = self._proposals = self._improved = 0
        self._rollout_failures = self._reflection_failures = self._sibling_merged = 0
        # A step's calls are those since the last record, not since its first event: with work in flight
        # across steps (the asynchronous schedule), a call billed before the event that opens the next step
        # belongs to that step, and the records' calls and dollars add up to the run's.
        self._tally0 = self._recorded or Tally()  # the first record's: everything since the run began (the seed's)
        self._rollouts0 = self.ledger.rollouts  # the step's rollouts are the run's since (one keeper: the ledger)
