"""gepa's pieces, configured for one run: what both schedules drive.

gepa's step loop and the asynchronous schedule draw parents, minibatches and the components to
rewrite with the same gepa strategies, reflect with the same pooled reflection and pick which
improving children to validate with the same selection, built here once per run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gepa.proposer.reflective_mutation.base import CandidateSelector
from gepa.strategies.proposal_selection import SelectionStrategy

from dspy_pxn.engine.description import resume_settings
from dspy_pxn.engine.resume import checkpoint
from dspy_pxn.proposer import selection as selections
from dspy_pxn.proposer.reflection import PooledReflection
from dspy_pxn.proposer.sibling_merge import SiblingMerge
from dspy_pxn.schedules.sampling import CANDIDATE_SELECTORS, SequentialMinibatchSampler, component_selector

if TYPE_CHECKING:  # types only: the run imports the schedules, never the other way round
    from dspy_pxn.engine.run import Live, Run


@dataclass(frozen=True)
class GepaParts:
    rng: random.Random  # shared by parent selection, minibatches and the crossover, as in gepa.optimize
    candidate_selector: CandidateSelector
    sampler: SequentialMinibatchSampler
    component_selector: Any  # a gepa ReflectionComponentSelector
    reflection: PooledReflection
    selection: SelectionStrategy  # all | best | top-k | sibling merge; each schedule caps it to its budget


def gepa_parts(run: Run, live: Live) -> GepaParts:
    settings = run.settings
    # One RNG shared by parent selection and minibatch shuffling, as gepa.optimize does,
    # so a 1×1 run draws the same parents and minibatches as dspy.GEPA.
    rng = random.Random(settings.seed)
    sampler = SequentialMinibatchSampler(run.minibatch_size, rng)
    # Their state is saved with gepa's, through the adapter's state hook (dspy_pxn.engine.resume).
    live.adapter.checkpoint = checkpoint(resume_settings(run.description), sampler, live.ledger.spent_usd)
    selector = settings.candidate_selection_strategy
    reflection = PooledReflection(live.adapter, run.reflection_lm, live.pool, live.events)
    if run.selection in selections.MERGES:
        # Written by a user's own instruction proposer where there is one (it writes every instruction the run
        # validates), else by the reflection LM from our merge prompt, in the adapter's reflections' reply format.
        selection = SiblingMerge(live.pool, run.reflection_lm, live.adapter.MERGE_FORMATS,
                                 proposer=reflection if reflection.custom_instructions else None,
                                 code_components=run.code_components, keep_best=run.selection == "merge+best",
                                 events=live.events)
    else:
        selection = selections.strategy(run.selection)
    return GepaParts(
        rng=rng, candidate_selector=CANDIDATE_SELECTORS[selector](rng) if isinstance(selector, str) else selector,
        sampler=sampler, component_selector=component_selector(settings.component_selector), reflection=reflection,
        selection=selection,
    )


def degraded(parts: GepaParts) -> bool:
    """Whether the run's selection can no longer merge (its merges came back unreadable): the schedules then run
    one proposal at a time, as dspy.GEPA does (``dspy_pxn.proposer.sibling_merge.SiblingMerge``)."""
    return bool(getattr(parts.selection, "degraded", False))
