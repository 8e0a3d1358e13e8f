"""StepRecord: the single per-step truth; the recorder that makes it and the log that keeps it.

Everything that reports on a run (the JSONL step log, MLflow, progress, the runtime
model) reads these records, so they carry the quantities the paper's runtime model
needs: width, acceptance, whether validation fired, and where the time went. gepa's
step loop writes one record per step; the asynchronous schedule one per *window* (its docstring).
"""

from __future__ import annotations

import json
import logging
import os
import threading
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
        wall_s: The step's wall-clock. ``screening_s``, ``reflection_s``, ``validation_s`` and
            ``sibling_merge_s`` are summed over the step's work, so with overlapping work (async)
            they may add up to more than ``wall_s``.
        rollouts: Rollouts run; ``rollout_failures`` of them scored as failures.
        reflection_failures: Reflection calls that proposed nothing.
        worker_utilisation: Busy worker-seconds over W × ``wall_s``.
        sibling_merged: Improving children merged into the validated candidate (``selection="merge"``).
        lm_calls: LM calls billed since the previous record (the first record: since the run began,
            the seed's validation included; calls answered from DSPy's cache are not billed), with
            ``prompt_tokens``, ``completion_tokens`` and ``cost_usd`` (None while no price is known
            for the models); ``cost_usd_total`` is the run's so far. The records add up to the run's
            ``usage`` and ``lm_call_counts``. The same split by who made the calls: ``task_lm_calls``,
            ``task_prompt_tokens``, ``task_completion_tokens``, ``task_cost_usd`` (the program, its metric) and
            ``reflection_lm_calls``, ``reflection_prompt_tokens``, ``reflection_completion_tokens``,
            ``reflection_cost_usd`` (reflections and sibling merges): the bill, as each LM's provider counts it.
        lm_retries: Requests sent again after a failed attempt (a 429, a 5xx, a timeout), None where
            DSPy does not tell them; ``lm_failures``: calls that failed after their last retry. The
            steps' retries add up to the run's (``lm_call_counts.retries``).
        schedule: ``"steps"`` or ``"async"``.
        cost_usd_left: Dollars left of ``max_cost_usd`` after the step (None without a dollar cap);
            ``wall_s_left``: seconds left before ``max_wall_s`` (None without a deadline).
        time_left_s: The estimated seconds until the first budget binds, at this run's pace so far
            (metric calls and dollars a second; the deadline's own seconds); ``time_left_budget`` names it.
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
        parts.append(validated)
        parts.append(f"best val {self.best_val:.3f}")
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
    """The run's ``log_dir/steps.jsonl``: one record per line, appended as each step ends.

    Written first and by itself, so a run that dies keeps every finished step, and a resumed
    run can drop the step that was in flight (``keep_first``).
    """

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
    """Hears a run's step events and gepa's iteration callbacks; emits one StepRecord per step.

    The phase of every evaluation comes with its event, so the recorder needs no guess
    about which ``batch_evaluate`` call is which. Counts add up over the events of a step,
    so a schedule that samples one task at a time (async) records the same fields. Each
    record goes to the sinks in order (the step log, progress lines, a tracker); a failing
    sink is a warning.
    """

    def __init__(
        self,
        p: int,
        n: int,
        shape: RunShape,
        pool: WorkerPool,
        ledger: RunLedger,
        sinks: Sequence[Callable[[StepRecord], None]] = (),
        schedule: str = "steps",
        caps: RunCaps | None = None,
    ):
        self.p, self.n, self.shape, self.schedule = p, n, shape, schedule
        self.pool = pool
        self.ledger, self.caps = ledger, caps
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
            self._phase_s[phase] = self._phase_s.get(phase, 0.0) + seconds
            self._rollout_failures += failures

    @override
    def reflected(self, seconds: float, jobs: int, failed: int) -> None:
        with self._lock:
            self._phase_s["reflection"] = self._phase_s.get("reflection", 0.0) + seconds
            self._reflection_failures += failed

    @override
    def sibling_merged(self, seconds: float, children: int) -> None:
        with self._lock:
            self._phase_s["sibling_merge"] = self._phase_s.get("sibling_merge", 0.0) + seconds
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
        """Whether an LM call ended or was billed after the last record: a schedule that ends with such calls and
        no step open (their events came too late to open one) writes one more record, so the last tells the
        run's usage."""
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
        time_left = self.ledger.time_left(state.total_num_evals, self.shape.budget,
                                          self.caps.usd_left() if self.caps else None,
                                          self.caps.seconds_left() if self.caps else None)
        record = StepRecord(
            step=state.i + 1,  # gepa's iteration number, so a resumed run continues the numbering
            kind=self._kind,
            p=self.p,
            n=self.n,
            width=self._width,
            distinct_parents=len(self._parents),
            proposals=self._proposals,
            accepted=len(self._new),
            full_validation=bool(self._new),
            new_candidates=list(self._new),
            metric_calls=state.total_num_evals - self._calls0,
            metric_calls_total=state.total_num_evals,
            budget=self.shape.budget,
            best_val=scores[best_program(state)],
            mean_val=sum(scores) / len(scores),
            pareto_front_size=len(pareto_front_programs(state)),
            wall_s=wall,
            reflection_s=self._phase_s.get("reflection", 0.0),
            screening_s=self._phase_s.get("screening", 0.0),
            validation_s=self._phase_s.get("validation", 0.0),
            rollouts=self.ledger.rollouts - self._rollouts0,
            rollout_failures=self._rollout_failures,
            reflection_failures=self._reflection_failures,
            worker_utilisation=busy / (self.pool.num_workers * wall) if wall > 0 else 0.0,
            num_workers=self.pool.num_workers,
            started_at=self._started_at,
            improved=self._improved,
            minibatch_size=self.shape.minibatch_size,
            val_size=self.shape.val_size,
            lm_calls=step.billed,
            prompt_tokens=step.prompt_tokens,
            completion_tokens=step.completion_tokens,
            cost_usd=step.task_usd + step.reflection_usd if total.cost_usd is not None else None,
            cost_usd_total=total.cost_usd,
            lm_retries=step.counts.retries if total.counts.retries is not None else None,
            lm_failures=step.failures,
            sibling_merged=self._sibling_merged,
            sibling_merge_s=self._phase_s.get("sibling_merge", 0.0),
            schedule=self.schedule,
            cost_usd_left=self.caps.usd_left() if self.caps is not None else None,
            wall_s_left=self.caps.seconds_left() if self.caps is not None else None,
            time_left_s=time_left[0],
            time_left_budget=time_left[1],
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
        self._phase_s: dict[str, float] = {}
        self._width = 0
        self._parents: set[int] = set()
        self._new: list[int] = []
        self._proposals = 0
        self._improved = 0
        # A step's calls are those since the last record, not since its first event: with work in flight
        # across steps (the asynchronous schedule), a call billed before the event that opens the next step
        # belongs to that step, and the records' calls and dollars add up to the run's.
        self._tally0 = self._recorded or Tally()  # the first record's: everything since the run began (the seed's)
        self._rollouts0 = self.ledger.rollouts  # the step's rollouts are the run's since (one keeper: the ledger)
        self._rollout_failures = 0
        self._reflection_failures = 0
        self._sibling_merged = 0
