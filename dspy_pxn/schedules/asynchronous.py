"""``schedule="async"``: proposals flow through the pool with no step barrier.

In gepa's step loop every step waits for its slowest piece, so with real, variable LM latency the pool idles behind
stragglers. Here P·N proposal *pipelines* are always in flight, each one parent → its minibatch (traced) → one
reflection → the child on the same minibatch. Improving children queue up; whenever no validation is running (or
one is, and enough improvers wait: ``width.starts_validation``), the queued ones go through the run's selection and
are validated together. Reflections run in the pipelines' own threads, never on a rollout worker, so they cannot
starve rollouts.

Staged screening. Where the minibatch is larger than what reflection reads (the default above one proposal at a time:
8 rows, 3 read; ``engine.width.screening_minibatch``), the parent is traced on the 3 rows its reflection reads, as in
dspy.GEPA, and the child is screened on them; only a child that beat its parent there is screened, with its parent, on
the other 5 rows, and it improves if it beats its parent on all 8. A try that fails costs 6 calls (dspy.GEPA's cost),
one that passes 16 and is accepted on a steadier signal, so the budget buys about as many tries as dspy.GEPA's loop,
and so as many generations where each improvement builds on the last (measured: ``docs/benchmark-log.md``, "Staged
screening"). The rows the parent's reflection does not read are reserved with the rest and released when unused.

A child that is already a candidate. A child whose text is a candidate in the pool or being validated, other than its
own parent, is not screened: its pipeline ends after its parent's first stage (gepa's proposer skips a child with no
new text for the same reason). Where each improvement builds on the last, a pipeline started from a candidate that
has since been improved on often rewrites it into that very improvement; screening, queueing and merging it spent
16 calls and a merge call to learn what the pool holds. A child identical to its parent is screened, as dspy.GEPA's
loop screens it: skipping those too buys more tries with the calls, and so more reflection calls (measured:
``docs/benchmark-log.md``, "A child already in the pool").

Parents. A pipeline started while a validation is in flight takes that validation's candidate as its parent
(``_Pending``), as dspy.GEPA's next step builds on the candidate it has just validated: it already beat its own
parent on screening, and validated candidates always join the pool. Its improving children wait for it to join
(their parent's index), then queue. Otherwise a pipeline picks its parent from the Pareto front as it stands.
Without this, every pipeline started during a validation proposes from the candidate's parent, which, where each
improvement builds on the last, teaches what the candidate knows.

gepa's ``GEPAState`` is the single record, joined through its own ``update_state_with_new_program``, saved as each
window starts and read by ``GEPAResult.from_state``, exactly as after ``gepa.optimize``. gepa lacks a scheduler
seam (its engine owns the loop), so this module drives the state with gepa's own parts (``schedules.parts``) and
leaves gepa's engine's bookkeeping to ``schedules.windows``: it is pipeline control only.

The budget is exact: a pipeline reserves its screening with the run's ``BudgetGuard`` when it starts, and a
validation the validations its selection may ask for; the guard keeps |val| free beside every reservation, so
whatever improves can be paid for. The run ends when nothing it waits for can change its result: once no budget is
left to validate another child, even with all that work in flight may still give back, a pipeline that has not yet
reflected stops there, and the search returns without the reflections still in flight (their calls are made and
paid for; they return to a run whose ledger says it has returned, so neither the step events nor the ledger hear
them): under a long-tailed reflection latency the slowest of them used to be the run's last, idle stretch.

Dollars and a deadline (``dspy_pxn.ledger.caps``): no pipeline or validation starts that the run's caps cannot pay
for or finish at the costs and latencies measured so far; once a cap refuses a call (the run's ``stop`` is
refusing), nothing more is launched, the work in flight drains, and the state is the result.

gepa's crossover (``use_merge=True``) runs in one of the pipelines' slots when a validation has added candidates
(``schedules.crossover``). One StepRecord is written per *window* (``schedules.windows``). Async runs are not
bit-reproducible: which pipeline finishes first depends on latency.
"""

from __future__ import annotations

import contextvars
import logging
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gepa.core.data_loader import ensure_loader
from gepa.core.result import GEPAResult
from gepa.core.state import GEPAState
from gepa.proposer.base import CandidateProposal
from gepa.strategies.acceptance import StrictImprovementAcceptance
from gepa.strategies.proposal_sampling import ProposalTask

from dspy_pxn.engine import width as widths
from dspy_pxn.engine.candidates import improvement, ties_the_best
from dspy_pxn.ledger.budget import Reservation
from dspy_pxn.ledger.caps import CapReached
from dspy_pxn.proposer import selection as selections
from dspy_pxn.schedules.crossover import MERGE_TAG, AsyncCrossover
from dspy_pxn.schedules.parts import GepaParts, degraded
from dspy_pxn.schedules.strategies import selected_within, stopper_telling
from dspy_pxn.schedules.windows import Validated, Windows, valset_evaluation

if TYPE_CHECKING:  # types only: the run imports the schedules, never the other way round
    from dspy_pxn.engine.run import Live, Run

logger = logging.getLogger(__name__)


@dataclass
class _Screened:  # a pipeline's child, scored on its parent's minibatch
    proposal: CandidateProposal
    improved: bool
    parent: _Pending | None = None  # the unvalidated candidate it was rewritten from, if it was


@dataclass(eq=False)
class _Pending:
    """A candidate being validated, which pipelines started meanwhile take as their parent: its pool index once
    it has joined (``index``), and the children screened on it before that (``waiting``)."""

    proposal: CandidateProposal
    candidate: dict[str, str]  # what its children are rewritten from
    stand_in: int  # the pool index its children are told as their parent's until it joins (its own parent's)
    index: int | None = None
    waiting: list[CandidateProposal] = field(default_factory=list)
    orphaned: str | None = None  # why its children cannot be validated (it did not join as they saw it)


class AsyncSchedule:
    """Runs the search with P·N proposals in flight; one instance per run."""

    @classmethod
    def run(cls, run: Run, live: Live, parts: GepaParts) -> GEPAResult:
        state = cls(run, live, parts).search()
        return GEPAResult.from_state(state, run_dir=run.settings.log_dir, seed=run.settings.seed)

    def __init__(self, run: Run, live: Live, parts: GepaParts):
        self.run, self.live, self.guard = run, live, run.guard
        self.parts = parts
        self.width = run.p * run.n
        self.trainset, self.valset = ensure_loader(run.trainset), ensure_loader(run.valset)
        self.windows = Windows(live.adapter, live.events, live.recorder, run.guard, live.gepa_callbacks, run.settings,
                               run.seed_candidate, self.trainset, self.valset)
        # Every read or write of the state and the reservations, and every step event, under one lock:
        # a screening's rollouts and the metric calls they cost land in the same window.
        self.lock = live.events.lock
        self.acceptance = StrictImprovementAcceptance()
        self.launched = 0  # pipelines started: each one's proposal id
        self.narrowest = self.width  # the narrowest launch width a dollar cap has left so far (``width.within_dollars``)
        self.caps, self.stop = live.caps, live.ledger  # the ledger holds the run's stop signal
        # Pipelines waiting on their reflection, by proposal id, with what the guard promised them.
        self.reflecting: dict[str, tuple[ProposalTask, Reservation]] = {}
        # Candidates being validated, by id of their proposal, and the latest of them, which new pipelines take as
        # their parent (``_Pending``; see the module docstring).
        self.pending: dict[int, _Pending] = {}
        self.latest: _Pending | None = None
        settings = run.settings
        self.crossover = AsyncCrossover(
            live.adapter, self.valset, run.guard, self.lock, self.parts.rng, settings.max_merge_invocations,
            settings.gepa_kwargs.get("merge_val_overlap_floor", 5), live.gepa_callbacks,
        ) if settings.use_merge else None  # gepa's crossover, beside the pipelines

    @property
    def state(self) -> GEPAState:
        return self.windows.state

    # ------------------------------------------------------------------------------ the run
    def search(self) -> GEPAState:
        self.windows.begin({"schedule": "async", "width": self.width})
        pipelines = ThreadPoolExecutor(max_workers=self.width, thread_name_prefix="dspy-pxn-proposal")
        validator = ThreadPoolExecutor(max_workers=widths.MAX_VALIDATIONS_IN_FLIGHT,
                                       thread_name_prefix="dspy-pxn-validation")
        in_flight: dict[Future, str] = {}
        queued: list[CandidateProposal] = []
        error: BaseException | None = None
        try:
            while True:
                if error is None and not self.stop.refusing and not self._stopped_by_user():
                    validating = sum(kind == "validation" for kind in in_flight.values())
                    if widths.starts_validation(validating, len(queued)):  # first: what launches next builds on it
                        self._validate(validator, in_flight, queued)
                        queued = []
                    self._launch(pipelines, in_flight, waiting=bool(queued))
                if not in_flight:
                    with self.lock:
                        self.guard.ended(self.state, self.stop)  # says so on the run's stop signal if its budget ended it
                    break
                if error is None and self._only_futile_reflections_left(in_flight):
                    self._stop_waiting_for_reflections()
                    break
                done, _ = wait(list(in_flight), return_when=FIRST_COMPLETED)
                for future in done:
                    kind = in_flight.pop(future)
                    try:
                        outcome = future.result()
                    except CapReached:  # a budget in dollars or time ended the run (the stop is refusing): drain
                        continue
                    except BaseException as failure:  # noqa: BLE001 - stop launching, drain, then raise
                        error = error or failure
                        continue
                    if outcome is None:
                        continue
                    if kind in ("validation", "crossover"):
                        queued.extend(self._join(outcome))
                    elif outcome.improved:  # an improving child queues for validation
                        self._queue(outcome, queued)
                    else:  # any other is rejected now
                        self.windows.rejected(outcome.proposal, "did not beat its parent on the minibatch",
                                              "not_improved")
        finally:
            pipelines.shutdown(wait=not self.stop.returned)
            validator.shutdown(wait=True)
            self.windows.close([*queued, *(child for pending in self.pending.values() for child in pending.waiting)])
        if error is not None:
            raise error
        self.windows.optimization_end()
        return self.state

    # ------------------------------------------------------------------------------ proposals
    def _launch(self, executor: ThreadPoolExecutor, in_flight: dict[Future, str], waiting: bool) -> None:
        """Start pipelines until ``width`` are in flight or the budget has no room for another. A run that can no
        longer merge (``degraded``) goes on as dspy.GEPA's loop does: one proposal, and its validation, at a time."""
        m, val_waves = self.guard.minibatch_size, self._waves(self.guard.valset_size)
        width = widths.within_dollars(self.run.settings.p, self.run.n, self.run.shape, self.width, self.narrowest,
                                      self.state.total_num_evals, self.caps)
        self.narrowest = min(self.narrowest, width)
        if degraded(self.parts):
            if in_flight or waiting:
                return
            width = 1
        while (pipelines := sum(kind != "validation" for kind in in_flight.values())) < width:
            with self.lock:
                # Dollars for this pipeline and those in flight, and one validation; time for its critical path.
                if self.caps is not None and self.caps.blocks(
                        rollouts=(pipelines + 1) * 2 * m + self.guard.valset_size, reflections=pipelines + 1,
                        rollout_waves=2 + val_waves, reflections_in_series=1):
                    return
                if self.crossover is not None and self.crossover.start(self.state):
                    in_flight[executor.submit(contextvars.copy_context().run, self.crossover.attempt,
                                              self.windows)] = "crossover"
                    continue
                if (reservation := self.guard.reserve_proposal(self.state)) is None:
                    return
                if (pending := self.latest) is not None:  # the candidate being validated
                    parent, candidate = pending.stand_in, pending.candidate
                else:
                    parent = self.parts.candidate_selector.select_candidate_idx(self.state)
                    candidate = self.state.program_candidates[parent]
                ids = self.parts.sampler.next_minibatch_ids(self.trainset, self.state)[:reservation.rows]
                task = ProposalTask(parent, candidate, ids, self.trainset.fetch(ids))
                self.live.events.tasks_sampled([task])
                self.launched += 1
            in_flight[executor.submit(contextvars.copy_context().run, self._pipeline, task, reservation,
                                      f"p{self.launched}", pending)] = "proposal"

    def _pipeline(self, task: ProposalTask, reservation: Reservation, proposal_id: str,
                  pending: _Pending | None) -> _Screened | None:
        """One proposal, on the screening the guard promised it (``reservation``); ``pending``: its parent is a
        candidate still being validated."""
        adapter, settings = self.live.adapter, self.run.settings
        # Staged screening: where the minibatch is larger than what reflection reads, the parent is traced on the
        # rows reflection reads, and the rest screen only a child that beat its parent there (see the docstring).
        first, later = task.minibatch[:self.run.reflection_examples], task.minibatch[self.run.reflection_examples:]
        before = adapter.evaluate(first, task.parent_candidate, capture_traces=True, phase="screening")
        perfect = settings.skip_perfect_score and settings.perfect_score is not None and all(
            s is not None and s >= settings.perfect_score for s in before.scores)  # as gepa's proposer skips
        if perfect or not before.trajectories:
            reason = "perfect score on the minibatch" if perfect else "no trajectories"
            return self._no_child(task, reservation, before.scores, reason)
        with self.lock:
            components = self.parts.component_selector(self.state, before.trajectories, before.scores,
                                                       task.parent_idx, task.parent_candidate)
        try:
            dataset = adapter.make_reflective_dataset(task.parent_candidate, before, components)
        except Exception as error:  # noqa: BLE001 - as gepa: a task whose dataset cannot be built is skipped
            logger.info("No reflective dataset for parent %d: %s", task.parent_idx, error)
            return self._no_child(task, reservation, before.scores, f"no reflective dataset: {error}")
        with self.lock:
            if not self.guard.can_still_validate(self.state):
                return self._no_child(task, reservation, before.scores, "no budget left to validate its child")
            self.reflecting[proposal_id] = (task, reservation)
        try:
            reflected = self.parts.reflection.propose((task.parent_candidate, dataset, components))
        finally:
            with self.lock:
                del self.reflecting[proposal_id]
        with self.lock:
            if self.stop.returned:  # the search returned while this reflection was in flight: not part of the run
                return None
            if not reflected.new_texts:
                error = (reflected.metadata or {}).get("reflection_error", "no new instruction")
                return self._no_child(task, reservation, before.scores, f"the reflection proposed nothing: {error}")
            if not self.guard.can_still_validate(self.state):
                return self._no_child(task, reservation, before.scores, "no budget left to validate its child")
            child = {**task.parent_candidate, **reflected.new_texts}
            if child != task.parent_candidate and self._known(child):
                return self._no_child(task, reservation, before.scores, "the child is a candidate already in the "
                                      "pool or being validated")
            self.guard.commit(reservation)  # its child's screening is spent from here on
        after = adapter.evaluate(first, child, capture_traces=False, phase="screening")
        replies = {f"raw_lm_output:{name}": text for name, text in reflected.raw_lm_outputs.items()}
        proposal = CandidateProposal(
            candidate=child, parent_program_ids=[task.parent_idx],
            subsample_indices=list(task.minibatch_ids[:len(first)]),
            subsample_scores_before=list(before.scores), subsample_scores_after=list(after.scores),
            tag="reflective_mutation", metadata={**reflected.metadata, **replies, "proposal_id": proposal_id},
        )
        if later:
            with self.lock:
                promising = self.acceptance.should_accept(proposal, self.state)
                if not promising:  # the rest of its screening is not needed
                    self.guard.release(reservation, 2 * len(later))
            if promising:
                parent_rest, child_rest = adapter.batch_evaluate(
                    [(task.parent_candidate, later), (child, later)], capture_traces=False, phase="screening")
                proposal.subsample_indices = list(task.minibatch_ids)
                proposal.subsample_scores_before = [*before.scores, *parent_rest.scores]
                proposal.subsample_scores_after = [*after.scores, *child_rest.scores]
        with self.lock:
            improved = self.acceptance.should_accept(proposal, self.state)
            self.live.events.children_screened(1, int(improved))
            self.guard.close(reservation)
        return _Screened(proposal, improved, pending)

    def _known(self, candidate: dict[str, str]) -> bool:
        """Whether ``candidate`` is in the pool or being validated (caller holds ``lock``): a child that is, other
        than its own parent, is not screened (the module docstring: "A child that is already a candidate")."""
        return candidate in self.state.program_candidates or any(
            candidate == pending.candidate for pending in self.pending.values())

    def _queue(self, screened: _Screened, queued: list[CandidateProposal]) -> None:
        """An improving child queues for validation once its parent is in the pool (with its index as parent)."""
        pending = screened.parent
        if pending is None:
            queued.append(screened.proposal)
        elif pending.orphaned:
            self.windows.rejected(screened.proposal, pending.orphaned, "improved_not_selected")
        elif pending.index is not None:
            screened.proposal.parent_program_ids = [pending.index]
            queued.append(screened.proposal)
        else:
            pending.waiting.append(screened.proposal)

    def _no_child(self, task: ProposalTask, reservation: Reservation, scores: list[float], reason: str) -> None:
        """The pipeline ends after its parent was screened on the rows its reflection reads: the child's reserved
        calls are not needed, nor the parent's on the rest of the minibatch (staged screening)."""
        read = task.minibatch_ids[:self.run.reflection_examples]
        with self.lock:
            self.guard.release(reservation, 2 * len(task.minibatch) - len(read))
            self.guard.close(reservation)
            self.windows.decided(task.parent_idx, "no_proposal", reason, minibatch_ids=read, scores=scores)

    def _only_futile_reflections_left(self, in_flight: dict[Future, str]) -> bool:
        """Whether all that is in flight is pipelines waiting on reflections whose children no budget is left
        to validate (see the module docstring: they cannot change the result)."""
        with self.lock:
            return (all(kind == "proposal" for kind in in_flight.values())
                    and len(self.reflecting) == len(in_flight) and not self.guard.can_still_validate(self.state))

    def _stop_waiting_for_reflections(self) -> None:  # see the module docstring
        with self.lock:
            self.live.ledger.search_returned()
            for task, reservation in self.reflecting.values():
                self._no_child(task, reservation, [], "the run ended before its reflection returned: no budget "
                               "was left to validate its child")
            left_in_flight = len(self.reflecting)
        logger.info("The search ended with %d reflection(s) in flight: no budget was left to validate their "
                    "children; their LM calls finish in the background, outside this run's usage and LM call "
                    "counts (lm_call_counts.abandoned counts them).", left_in_flight)

    def _stopped_by_user(self) -> bool:
        """Whether a stopper passed in ``gepa_kwargs["stop_callbacks"]`` says the run is over (no more launches)."""
        with self.lock:
            return any(stopper_telling(self.stop, stopper)(self.state) for stopper in self.run.settings.stop_callbacks)

    # ------------------------------------------------------------------------------ validation
    def _validate(self, executor: ThreadPoolExecutor, in_flight: dict[Future, str],
                  batch: list[CandidateProposal]) -> None:
        """Reserve the validations the selection may ask for, then select and validate off the driver
        thread (a sibling merge's reflection call must not hold up the pipelines)."""
        with self.lock:
            one_at_a_time = degraded(self.parts)  # every improving child is validated, as dspy.GEPA does
            wanted = len(batch) if one_at_a_time else selections.kept(self.run.selection, len(batch))
            merges = int(self.run.selection in selections.MERGES and not one_at_a_time)
            val = self.guard.valset_size
            if self.caps is not None and self.caps.blocks(rollouts=wanted * val, reflections=merges,
                                                          rollout_waves=self._waves(wanted * val),
                                                          reflections_in_series=merges):
                wanted = 0
            reservation = self.guard.reserve_validations(self.state, wanted) if wanted else None
        if reservation is None:
            for proposal in batch:
                self.windows.rejected(proposal, "no budget left to validate it", "improved_not_selected")
            return
        if len(batch) == 1 and ties_the_best(self.state, batch[0].parent_program_ids[0]):
            self._building_on(batch[0])  # a lone child of a best candidate is validated as it is: build on it now
        in_flight[executor.submit(contextvars.copy_context().run, self._select_and_validate, batch, reservation)] = (
            "validation")

    def _building_on(self, proposal: CandidateProposal) -> None:
        """Pipelines started from now on take ``proposal``'s candidate, being validated, as their parent."""
        with self.lock:
            if id(proposal) not in self.pending:
                self.pending[id(proposal)] = _Pending(proposal, dict(proposal.candidate), proposal.parent_program_ids[0])
            self.latest = self.pending[id(proposal)]

    def _waves(self, rollouts: int) -> int:
        """Rounds of one task call each that this many rollouts take on the pool."""
        return -(-rollouts // self.live.pool.num_workers)

    def _select_and_validate(self, batch: list[CandidateProposal], reservation: Reservation) -> Validated:
        # Unlocked: a sibling merge calls the reflection LM here. Another validation's candidates may be
        # joining the state meanwhile; gepa appends a candidate before its scores, so the reads see a
        # consistent prefix of the pool (the newest candidate may not be among them yet).
        selected = selected_within(self.parts.selection, batch, self.state, self.acceptance, reservation.validations)
        with self.lock:
            if self.latest is not None and any(self.latest.proposal is p for p in batch) and (
                    self.latest.proposal.candidate != self.latest.candidate or not selected):
                self.latest = None  # it will not be validated as it was: pipelines take their parents from the pool
            if selected:  # pipelines started from now on build on the candidate this validation is most sure of
                self._building_on(max(selected, key=improvement))
            self.guard.release(reservation, (reservation.validations - len(selected)) * self.guard.valset_size)
            self.guard.commit(reservation)
            discovered_at = self.state.total_num_evals
        ids = list(self.valset.all_ids())
        examples = self.valset.fetch(ids)
        try:
            evaluations = self.live.adapter.batch_evaluate([(p.candidate, examples) for p in selected],
                                                           capture_traces=False, phase="validation")
        finally:
            with self.lock:
                self.guard.close(reservation)
        chosen = {id(p) for p in selected}
        return Validated(selected, [valset_evaluation(ids, e) for e in evaluations],
                          [p for p in batch if id(p) not in chosen], discovered_at)

    def _join(self, validated: Validated) -> list[CandidateProposal]:
        """The validated candidates join the pool; a crossover's is one done, any other makes one due. Returns the
        improving children of a joined candidate that were waiting for it (their parent's index now known)."""
        released: list[CandidateProposal] = []
        with self.lock:
            for proposal, index in self.windows.join(validated):
                if (pending := self._forget(proposal)) is not None:
                    pending.index = index
                    for child in pending.waiting:
                        child.parent_program_ids = [index]
                    if proposal.candidate == pending.candidate:
                        released.extend(pending.waiting)
                    else:  # the merge rewrote it after they started: what they were rewritten from never joined
                        self._orphaned(pending, "the candidate it was rewritten from changed before it was validated")
                if self.crossover is not None and proposal.tag == MERGE_TAG:
                    self.crossover.accepted()
                elif self.crossover is not None:
                    self.crossover.found_new_program()
            for proposal in [*validated.selected, *validated.passed_over]:  # not joined: no one builds on it
                if (pending := self._forget(proposal)) is not None:
                    self._orphaned(pending, "the candidate it was rewritten from was not validated")
        return released

    def _forget(self, proposal: CandidateProposal) -> _Pending | None:
        """The candidate's validation is over (caller holds ``lock``): its entry, which no pipeline builds on any
        more."""
        pending = self.pending.pop(id(proposal), None)
        if pending is not None and self.latest is pending:
            self.latest = None
        return pending

    def _orphaned(self, pending: _Pending, reason: str) -> None:
        """Improving children of a candidate that did not join the pool as they saw it: none can be validated."""
        pending.orphaned = reason
        for child in pending.waiting:
            self.windows.rejected(child, reason, "improved_not_selected")
        pending.waiting.clear()
