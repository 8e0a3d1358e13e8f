"""How wide ``p="auto"`` runs: as many proposals in flight as the pool has workers, as the budget allows.

In the async schedule the width P·N is the number of proposal pipelines in flight; each keeps m
rollouts busy while it screens, and the validations share the same pool. A width below W leaves
workers idle whenever no validation runs (the README's W = 64 table: 4×4 merge ran at 1.8× the
floor), so the width follows the pool.

Wider is not free: at a fixed budget B, every validation window spends about P·N·2m calls on
screening and |val| on validating the merged improvers, so a wider run has fewer windows, and
each window is at most one generation. Measured (``docs/benchmarks.md``, "Filling a wide pool"),
the async merge default kept dspy.GEPA 1×1's held-out where a run had about five windows or more:
4×4 at W = 16, B = 600, |val| = 30 (4.8 windows) and 64 wide at W = 64, B = 3000, |val| = 150
(5.6). So the width is the pool's, capped where the budget would buy fewer than
``MIN_VALIDATION_WINDOWS`` windows.

Where the pool is wider than the valset (W > |val|), one validation cannot fill it, and the
budget-capped width leaves workers idle while the pipelines reflect: there the async schedule
runs two validations at once (``validations_in_flight``). Measured at W = 256, |val| = 150
(``docs/benchmarks.md``, "W = 256"): 6-13% sooner on both landscapes, held-out within the
seeds' spread (5 seeds under fixed call times: −0.010 depth, +0.012 breadth). At W = 64,
|val| = 150 it was 2-5% sooner and as good, but there one validation already fills the pool.
"""

from __future__ import annotations

from dspy_pxn.budget import RunShape

AUTO = "auto"

# Windows (≈ generations) the budget must buy at the chosen width; see the module docstring.
MIN_VALIDATION_WINDOWS = 5


def auto_width(shape: RunShape) -> int:
    """P·N for ``p="auto"``: the pool's W, at most what leaves the budget ``MIN_VALIDATION_WINDOWS`` windows."""
    per_window = shape.budget / MIN_VALIDATION_WINDOWS - shape.val_size
    budget_cap = int(per_window // (2 * shape.minibatch_size))
    return max(1, min(shape.workers, budget_cap))


def auto_parents(shape: RunShape, n: int) -> int:
    """P for ``p="auto"`` with ``n`` mutations per parent: the auto width, in whole parents."""
    return max(1, auto_width(shape) // n)


def validations_in_flight(shape: RunShape) -> int:
    """Validations the async schedule runs at once: two where the pool is wider than the valset, else one."""
    return 2 if shape.workers > shape.val_size else 1
