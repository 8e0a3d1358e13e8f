"""A run's shape and the exact-budget arithmetic every part of the run shares.

The budget guard, the step recorder, the run's self-description and the runtime model all
reason about the same four numbers (workers W, budget B, |val|, minibatch m), so they live
in one ``RunShape``; and the guard's arithmetic (how wide a step may be, how many children
it may validate, when to stop, what work in flight has been promised) is written once,
here, so no schedule and no model computes a budget of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from dspy_pxn.checks import positive_int
from dspy_pxn.ledger.ledger import RunLedger

# gepa's crossover (use_merge=True) scores the crossed program on at most this many val examples
# (gepa.proposer.merge: num_subsample_ids=5) before its full validation.
CROSSOVER_SUBSAMPLE_CALLS = 5


class SpendsMetricCalls(Protocol):
    """What the guard reads of gepa's ``GEPAState``: the metric calls spent so far."""

    total_num_evals: int

    def increment_evals(self, count: int) -> None: ...


@dataclass(frozen=True)
class RunShape:
    """What the user fixes before a run: worker pool W, budget B, |val|, minibatch m."""

    workers: int
    budget: int
    val_size: int
    minibatch_size: int = 3

    def __post_init__(self) -> None:
        positive_int("workers", self.workers, "W is the number of concurrent rollouts (num_threads).")
        positive_int("budget", self.budget, "Pass the run's max_metric_calls.")
        positive_int("val_size", self.val_size, "Pass the number of validation examples.")
        positive_int("minibatch_size", self.minibatch_size, "Pass reflection_minibatch_size (default 3).")
        if self.budget < self.val_size:
            raise ValueError(
                f"budget={self.budget} cannot pay for one validation of val_size={self.val_size}; "
                "raise the budget or shrink the valset."
            )


class BudgetGuard:
    """Plans the run's work so it never spends more than ``max_metric_calls``.

    A proposal costs m calls to screen its parent, m to screen its child (m = minibatch
    size), and |val| if the child is sent to full validation. In gepa's step loop the
    guard sizes each step before sampling, caps how many children are validated after
    screening, and stops the run once no useful step fits. A schedule with work in
    flight (the asynchronous one) *reserves* calls before it starts work, *spends* them
    as rollouts finish and *releases* what it did not use; everything the guard says is
    left excludes what is reserved. The reservations are not locked here: the schedule
    that makes them holds its own lock around them and around the state they are spent in.
    """

    def __init__(self, max_metric_calls: int, valset_size: int, minibatch_size: int, crossover: bool = False,
                 name: str = "max_metric_calls", shrinks: bool = False):
        self.max_metric_calls = max_metric_calls
        self.valset_size = valset_size
        self.minibatch_size = minibatch_size
        # The minibatch was left to the optimizer: where the budget cannot pay for one full proposal and its
        # validation after the seed's, the run's first proposal is screened on the rows it can pay for
        # (``screening_rows``), where dspy.GEPA's loop overspends the budget to take its step. A user's own
        # reflection_minibatch_size is never shrunk, and once a proposal was made the run stops where the next
        # full one no longer fits: a smaller last proposal at the end of every run cost 4-6% more reflection calls
        # for no held-out gain (docs/benchmark-log.md, "A smaller last proposal").
        self.shrinks = shrinks
        self.crossover = crossover  # gepa's crossover (use_merge=True) may replace a step, or run beside them
        self.name = name  # what the budget is called where it ends the run: "max_metric_calls", or "auto"
        self.reserved = 0  # calls promised to work in flight, not yet spent
        self.open: set[Reservation] = set()  # the work in flight the promises are for

    @classmethod
    def of(cls, shape: RunShape, crossover: bool = False) -> BudgetGuard:
        return cls(shape.budget, shape.val_size, shape.minibatch_size, crossover)

    def __repr__(self) -> str:
        return (f"BudgetGuard(max_metric_calls={self.max_metric_calls}, valset_size={self.valset_size}, "
                f"minibatch_size={self.minibatch_size}, crossover={self.crossover}, shrinks={self.shrinks}, "
                f"reserved={self.reserved})")

    # -- on counts of remaining calls (shared with the runtime model) ---------------
    def widest_step(self, remaining: float, first: bool = False) -> int:
        """Widest step that still leaves room to validate one child: one proposal on fewer rows where only that
        fits and it is the run's ``first`` (``screening_rows``)."""
        full = max(0, int((remaining - self.valset_size) // self.proposal_cost()))
        return full or int(self.screening_rows(remaining, first) > 0)

    def screening_rows(self, remaining: float, first: bool = False) -> int:
        """The rows the next proposal is screened on, its parent and its child, with a validation left beside it:
        the minibatch; for the run's ``first`` where the guard ``shrinks``, as many rows as fit; else 0."""
        fit = max(0, int((remaining - self.valset_size) // 2))
        if fit >= self.minibatch_size:
            return self.minibatch_size
        return fit if self.shrinks and first else 0

    def validations_affordable(self, remaining: float) -> int:
        return max(0, int(remaining // self.valset_size))

    def can_step(self, remaining: float, crossover_due: bool = False, first: bool = False) -> bool:
        return remaining >= self.smallest_step(crossover_due, first)

    def proposal_cost(self) -> int:
        """Calls to screen one proposal: its parent and its child on one minibatch each."""
        return 2 * self.minibatch_size

    def smallest_step(self, crossover_due: bool = False, first: bool = False) -> int:
        """Calls needed for one proposal that is screened (the run's ``first`` on one row, where the guard
        ``shrinks``) and validated, or for the crossover gepa's step loop tries first when one is due (it takes the
        step: screened on a few val examples, validated)."""
        reflective = 2 * (self.fewest_rows() if first else self.minibatch_size) + self.valset_size
        crossover = CROSSOVER_SUBSAMPLE_CALLS + self.valset_size if self.crossover and crossover_due else 0
        return max(reflective, crossover)

    def fewest_rows(self) -> int:
        """The fewest rows the run's first proposal may be screened on: one where the guard ``shrinks``."""
        return 1 if self.shrinks else self.minibatch_size

    def smallest_budget(self) -> int:
        """Calls for the seed's validation plus one proposal screened and validated: one useful step."""
        return self.valset_size + self.smallest_step(first=True)

    # -- on gepa's state ------------------------------------------------------------
    def remaining(self, state: SpendsMetricCalls) -> int:
        """Calls neither spent nor promised to work in flight."""
        return self.max_metric_calls - state.total_num_evals - self.reserved

    def first_proposal(self, state: SpendsMetricCalls) -> bool:
        """Whether nothing but the seed's validation was spent or promised: the run's first proposal is next."""
        return state.total_num_evals + self.reserved <= self.valset_size

    def max_proposals(self, state: SpendsMetricCalls) -> int:
        return self.widest_step(self.remaining(state), self.first_proposal(state))

    def max_validations(self, state: SpendsMetricCalls) -> int:
        return self.validations_affordable(self.remaining(state))

    # -- reservations: work in flight ---------------------------------------------------
    def _promise(self, calls: int, releasable: int) -> Reservation:
        self.reserved += calls
        reservation = Reservation(releasable)
        self.open.add(reservation)
        return reservation

    def reserve_proposal(self, state: SpendsMetricCalls) -> Reservation | None:
        """One proposal's screening (its parent's and its child's rows: ``reservation.rows`` of them, the minibatch
        or fewer, ``screening_rows``), if |val| stays free beside it for a validation; the child's share may come
        back until the child is screened."""
        rows = self.screening_rows(self.remaining(state), self.first_proposal(state))
        if rows < 1:
            return None
        reservation = self._promise(2 * rows, releasable=rows)
        reservation.rows = rows
        return reservation

    def reserve_crossover(self, state: SpendsMetricCalls) -> Reservation | None:
        """One crossover's screening (gepa scores it on a few val examples), if |val| stays free beside it for its
        validation."""
        if self.remaining(state) < CROSSOVER_SUBSAMPLE_CALLS + self.valset_size:
            return None
        return self._promise(CROSSOVER_SUBSAMPLE_CALLS, releasable=CROSSOVER_SUBSAMPLE_CALLS)

    def reserve_validations(self, state: SpendsMetricCalls, wanted: int) -> Reservation | None:
        """Up to ``wanted`` full validations (``reservation.validations``), which may all come back until it is
        known which candidates are validated; None when not one fits."""
        granted = min(wanted, self.max_validations(state))
        if granted < 1:
            return None
        reservation = self._promise(granted * self.valset_size, releasable=granted * self.valset_size)
        reservation.validations = granted
        return reservation

    def spend(self, state: SpendsMetricCalls, calls: int) -> None:
        """Promised calls were made: they count in gepa's state and are no longer reserved."""
        state.increment_evals(calls)
        self.reserved -= calls

    def release(self, reservation: Reservation, calls: int) -> None:
        """Promised calls that will not be made (a child not screened, a validation not needed)."""
        self.reserved -= calls
        reservation.releasable = max(0, reservation.releasable - calls)

    def commit(self, reservation: Reservation) -> None:
        """What is left of the promise will be spent: none of it can come back any more."""
        reservation.releasable = 0

    def close(self, reservation: Reservation) -> None:
        """The work is over; whatever it did not spend was released."""
        self.open.discard(reservation)

    def can_still_validate(self, state: SpendsMetricCalls) -> bool:
        """Whether one more full validation could ever be paid for, if all that work in flight may still give
        back came free. When not, no child still in flight can be validated, so nothing in flight but the
        validations can change the run's result."""
        return self.remaining(state) + sum(r.releasable for r in self.open) >= self.valset_size

    def ended(self, state: SpendsMetricCalls, ledger: RunLedger, crossover_due: bool = False) -> bool:
        """Whether what is left cannot pay for the step the run would take next; if so, the guard says on the run's
        stop signal (the ``ledger``'s) that its budget ended the run: the first budget to say so is the one the
        run reports."""
        if self.can_step(self.remaining(state), crossover_due, self.first_proposal(state)):
            return False
        ledger.end(self.name, f"{self.remaining(state)} metric calls left cannot pay for another step")
        return True


@dataclass(eq=False)
class Reservation:
    """Calls the guard promised one piece of work in flight: how many of them it may still give back, and for
    a validation's, how many validations it pays for."""

    releasable: int
    validations: int = 0
    rows: int = 0  # a proposal's: the rows its parent and its child are screened on
