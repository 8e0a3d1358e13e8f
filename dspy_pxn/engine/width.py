"""How wide ``p="auto"`` runs: as many proposals in flight as the pool has workers, as the budget allows.

In the async schedule the width P·N is the number of proposal pipelines in flight; each keeps m rollouts busy while it
screens, and the validations share the same pool. A width below W leaves workers idle whenever no validation runs (the
README's W = 64 table: 4×4 merge ran at 1.8× the floor), so the width follows the pool.

Wider is not free: at a fixed budget B, every validation window spends about P·N·2m calls on screening and |val| on
validating the merged improvers, so a wider run has fewer windows, and each window is at most one generation. With
proposals screened on 3 examples, the async merge kept dspy.GEPA 1×1's held-out at about five windows
(``docs/benchmark-log.md``, "Filling a wide pool"). Screened on a quarter of |val| (the default above one proposal at a
time), a window costs more and five left too few generations: at W = 16, B = 600, |val| = 30 (10 seeds against dspy.GEPA
with its defaults, ``docs/benchmarks.md``, "Other settings"), 5 in flight scored −0.054 / −0.029 on the depth / breadth
landscapes and −0.35 where each improvement builds on the last; 3 in flight (seven windows) −0.028 / +0.013 and −0.25,
at 3.2-5.0× dspy.GEPA's speed instead of 3.8-6.4×, with fewer reflection calls. So the width is the pool's, capped where
the budget would buy fewer than ``MIN_VALIDATION_WINDOWS`` windows.

Since the async schedule screens in stages (``schedules.asynchronous``: a child is screened on the rows its parent's
reflection read, and on the rest of the minibatch only if it beat its parent there), most proposals cost 2 × 3 calls,
not 2m, and a window holds more of them than the 2m the width counts per proposal. At W = 16, B = 600, |val| = 30,
10 seeds on three landscapes with fixed call times, against dspy.GEPA: 3 in flight (seven windows) scored −0.003 /
+0.006 / −0.088 (depth / breadth / chain) at 2.7-3.2× its speed; 4 (six windows) +0.010 / +0.034 / −0.093 at 3.05-3.7×,
1.08-1.30× its reflection calls; 5 −0.025 / +0.023 / −0.131 (``docs/benchmark-log.md``, "Staged screening").

Under a dollar cap (``max_cost_usd``, gepa's ``max_reflection_cost``) the budget that binds may be the dollars: the
async schedule plans the same width again at each launch from the calls the dollars left buy at the run's cost per
call so far (``within_dollars``), never wider than planned from the call budget. Planned from a loose call budget
alone (W = 16, B = 6000, the dollars dspy.GEPA spent on B = 600), 16 in flight scored 0.245 below dspy.GEPA where
each improvement builds on the last (``docs/benchmark-log.md``, "At dspy.GEPA's dollars"). Before a reflection is
billed the cost per call is the task's alone, so the first pipelines may run wider than the plan that follows.

Validations in flight (``starts_validation``): one validation at a time leaves the pool to the pipelines while a sibling
merge's reflection runs and while the validation's last wave drains, and a wide pool has improvers waiting all the
while. So a second validation may start beside the first, but only once ``SECOND_VALIDATION_MIN_IMPROVERS`` improvers
wait: it costs |val| calls whatever it validates, and one started for the first improver or two folds little into its
merge. Measured side by side (``docs/benchmarks.md``, "Two validations in flight"; 5 seeds, both landscapes, fixed and
lognormal call times), against one at a time: at W = 64, |val| = 150, waiting for 8 gave +0.011 to +0.030 held-out in
all four cells and was as fast (1-10% sooner with a second benchmark sharing the cores; alone, the lognormal walls did
not move); at W = 16, |val| = 30, starting at once cost 0.063 held-out on the mean of the cells, waiting for 4 cost
0.029, waiting for 8 0.004 (within a rerun's spread) at the same wall. At W = 256, where the second one used to start at
once (W > |val|), waiting for 8 is as fast, and over ten seeds paired with dspy.GEPA 1×1 the held-out gap went from
−0.025 / −0.032 to −0.011 / −0.022 with fixed call times.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Protocol

from dspy_pxn.ledger.budget import RunShape

logger = logging.getLogger(__name__)


class AffordsCalls(Protocol):
    """What ``within_dollars`` reads of the run's caps (``ledger.caps.RunCaps``)."""

    def metric_calls_affordable(self, metric_calls: int) -> float | None: ...

AUTO = "auto"

# Windows (≈ generations) the budget must buy at the chosen width, counting 2m calls per proposal (what the budget
# guard reserves for one); see the module docstring.
MIN_VALIDATION_WINDOWS = 6

# The windows BatchedGepaPromptOptimizer's default width leaves (one pipeline per row in flight, within them): at
# B = 300, |val| = 30, W = 10, five windows run 5 wide. Since pipelines started beside a validation build on its
# candidate (docs/benchmark-log.md, "Building on the candidate in validation"), 5 wide scored above 10 wide (three
# windows) against MLflow's own GEPA optimizer on every landscape, 10 seeds each: final −0.013 / +0.067 / −0.150
# (depth, breadth, chain) against −0.027 / +0.000 / −0.240, at 2.3-3.7× MLflow's speed instead of 2.7-4.8× and
# 2.0× its reflection calls instead of 2.4-2.5×. (Before that change 5 wide scored 0.06 below 10 wide on depth.) The
# cap keeps a pool much wider than the budget (W = 64 at B = 300) from spending it all in one window.
PROMPT_VALIDATION_WINDOWS = 5

# The minibatch reflection reads, dspy.GEPA's reflection_minibatch_size default: at one proposal at a time it is also
# the minibatch each proposal is screened on.
REFLECTION_EXAMPLES = 3
# Above one proposal at a time the default screens each parent and child on one training example per this many
# validation examples (8 at |val| = 30, 38 at |val| = 150), of which reflection reads the REFLECTION_EXAMPLES
# lowest-scoring rows; see ``screening_minibatch``.
VAL_PER_SCREENED_EXAMPLE = 4

# Validations at once, and the improvers one beyond the first waits for; see the module docstring.
MAX_VALIDATIONS_IN_FLIGHT = 2
SECOND_VALIDATION_MIN_IMPROVERS = 8


def auto_width(shape: RunShape, windows: int = MIN_VALIDATION_WINDOWS) -> int:
    """P·N for ``p="auto"``: the pool's W, at most what leaves the budget ``windows`` validation windows."""
    per_window = shape.budget / windows - shape.val_size
    budget_cap = int(per_window // (2 * shape.minibatch_size))
    return max(1, min(shape.workers, budget_cap))


def auto_parents(shape: RunShape, n: int, windows: int = MIN_VALIDATION_WINDOWS) -> int:
    """P for ``p="auto"`` with ``n`` mutations per parent: the auto width, in whole parents."""
    return max(1, auto_width(shape, windows) // n)


def within_dollars(p: int | str, n: int, shape: RunShape, planned: int, narrowest: int, spent: int,
                   caps: AffordsCalls | None) -> int:
    """P·N for the async schedule's next launch: the ``planned`` width, or under ``p="auto"`` with a dollar cap, the
    width ``p="auto"`` gives for the metric calls the dollars left buy at the run's cost per call so far (``spent``
    calls in), where those are fewer than the ``shape``'s budget; see the module docstring. A width narrower than the
    ``narrowest`` so far is said."""
    if p != AUTO or caps is None:
        return planned
    affordable = caps.metric_calls_affordable(spent)
    if affordable is None or spent + affordable >= shape.budget:
        return planned
    budget = max(shape.val_size, int(spent + affordable))
    width = min(planned, auto_parents(replace(shape, budget=budget), n) * n)
    if width < narrowest:
        logger.info("p='auto': %d proposals in flight, not %d: the dollar cap buys about %d metric calls in all at "
                    "the cost per call so far (max_metric_calls=%d).", width, planned, budget, shape.budget)
    return width


def starts_validation(running: int, waiting: int) -> bool:
    """Whether the async schedule validates the ``waiting`` improvers now, with ``running`` validations in flight."""
    if waiting == 0 or running >= MAX_VALIDATIONS_IN_FLIGHT:
        return False
    return running == 0 or waiting >= SECOND_VALIDATION_MIN_IMPROVERS


def rows_reflection_reads(given_minibatch: int | None) -> int:
    """The rows of each screening a parent is traced on and its reflection reads: all of a minibatch the user gave
    (``reflection_minibatch_size``), else ``REFLECTION_EXAMPLES``; the async schedule screens any further rows of a
    larger minibatch in a second stage (``schedules.asynchronous``)."""
    return given_minibatch or REFLECTION_EXAMPLES


def screening_minibatch(train_size: int, val_size: int) -> int:
    """The minibatch each proposal is screened on when proposals run side by side and the user left
    ``reflection_minibatch_size`` to the optimizer: a quarter of |val|, within the trainset.

    dspy.GEPA validates a large share of the proposals it screens on 3 examples, so most of its metric calls go
    to validations (|val| each) and it makes one reflection call per ~|val|/2 of them. Several proposals in
    flight, merged into one validated candidate (the sibling merge), validate far fewer candidates: with the same
    3-example screening the budget then buys 2-4x dspy.GEPA's reflection calls, and reflection is the expensive
    LM. Screening on more examples spends the calls a validation no longer takes on a steadier accept decision
    instead of more proposals: a window of ~4 proposals and its merge then cost about what ~4 of dspy.GEPA's
    proposals cost, in calls of both LMs. Reflection still reads only ``REFLECTION_EXAMPLES`` of them (the
    lowest-scoring: where the feedback teaches), so each reflection prompt is as long as dspy.GEPA's.
    """
    return max(REFLECTION_EXAMPLES, min(-(-val_size // VAL_PER_SCREENED_EXAMPLE), train_size))
