"""A run's shape and the exact-budget arithmetic every part of the run shares.

The budget guard, the step recorder, the run's self-description and the runtime model all
reason about the same four numbers (workers W, budget B, |val|, minibatch m), so they live
in one ``RunShape``; and the guard's arithmetic (how wide a step may be, how many children
it may validate, when to stop) is written once, here, on plain counts of remaining calls,
so the optimizer's guard and the runtime model's prediction cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from gepa.core.state import GEPAState

from dspy_pxn.checks import positive_int

# A merge proposal scores the merged program on at most this many val examples
# (gepa.proposer.merge: num_subsample_ids=5) before its full validation.
MERGE_SUBSAMPLE_CALLS = 5


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


@dataclass(frozen=True)
class BudgetGuard:
    """Plans each step so the run never spends more than ``max_metric_calls``.

    A reflective step with k proposals costs k·m calls to screen the parents, k·m to
    screen the children (m = minibatch size), and |val| per child sent to full
    validation. The guard sizes k before sampling, caps how many children are
    validated after screening, and stops the run once no useful step fits.
    """

    max_metric_calls: int
    valset_size: int
    minibatch_size: int
    use_merge: bool = False

    @classmethod
    def of(cls, shape: RunShape, use_merge: bool = False) -> BudgetGuard:
        return cls(shape.budget, shape.val_size, shape.minibatch_size, use_merge)

    # -- on counts of remaining calls (shared with the runtime model) ---------------
    def widest_step(self, remaining: float) -> int:
        """Widest step that still leaves room to validate one child."""
        return max(0, int((remaining - self.valset_size) // (2 * self.minibatch_size)))

    def validations_affordable(self, remaining: float) -> int:
        return max(0, int(remaining // self.valset_size))

    def can_step(self, remaining: float) -> bool:
        return remaining >= self.smallest_step()

    def smallest_step(self) -> int:
        """Calls needed for one proposal that is screened and validated (or one merge)."""
        reflective = 2 * self.minibatch_size + self.valset_size
        merge = MERGE_SUBSAMPLE_CALLS + self.valset_size if self.use_merge else 0
        return max(reflective, merge)

    def smallest_budget(self) -> int:
        """Calls for the seed's validation plus one proposal screened and validated: one useful step."""
        return self.valset_size + 2 * self.minibatch_size + self.valset_size

    # -- on gepa's state ------------------------------------------------------------
    def remaining(self, state: GEPAState) -> int:
        return self.max_metric_calls - state.total_num_evals

    def max_proposals(self, state: GEPAState) -> int:
        return self.widest_step(self.remaining(state))

    def max_validations(self, state: GEPAState) -> int:
        return self.validations_affordable(self.remaining(state))
