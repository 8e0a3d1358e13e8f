"""gepa's pieces, configured for one run: what both schedules drive.

gepa's step loop and the asynchronous schedule draw parents, minibatches and the components to
rewrite with the same gepa strategies, reflect with the same pooled reflection and pick which
improving children to validate with the same selection, built here once per run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from gepa.proposer.reflective_mutation.base import CandidateSelector
from gepa.strategies.proposal_selection import SelectionStrategy

from dspy_pxn.engine.events import StepEvents
from dspy_pxn.engine.pooled_adapter import PooledAdapter
from dspy_pxn.engine.sampling import CANDIDATE_SELECTORS, SequentialMinibatchSampler, component_selector
from dspy_pxn.pools import WorkerPool
from dspy_pxn.proposer import selection as selections
from dspy_pxn.proposer.reflection import PooledReflection
from dspy_pxn.proposer.sibling_merge import SiblingMerge


@dataclass(frozen=True)
class GepaParts:
    rng: random.Random  # shared by parent selection, minibatches and the crossover, as in gepa.optimize
    candidate_selector: CandidateSelector
    sampler: SequentialMinibatchSampler
    component_selector: Any  # a gepa ReflectionComponentSelector
    reflection: PooledReflection
    selection: SelectionStrategy  # all | best | top-k | sibling merge; each schedule caps it to its budget


def gepa_parts(sampler: SequentialMinibatchSampler, *, candidate_selection_strategy: Any, selected_component: Any,
               selection: Any, reflection_lm: Any, adapter: PooledAdapter, pool: WorkerPool, events: StepEvents,
               code_components: tuple[str, ...]) -> GepaParts:
    """The parts, from the run's sampler and its generator (``Run.resources`` makes them: one generator for parent
    selection and minibatches, as gepa.optimize, so a 1×1 run draws dspy.GEPA's parents and minibatches), the
    arguments that name gepa's selectors (``candidate_selection_strategy``, ``selected_component``: BatchedGEPA's
    ``component_selector``) and the run's ``selection``."""
    rng = sampler.rng
    reflection = PooledReflection(adapter, reflection_lm, pool, events)
    if selection in selections.MERGES:
        # Written by a user's own instruction proposer where there is one (it writes every instruction the run
        # validates), else by the reflection LM from our merge prompt, in the adapter's reflections' reply format.
        strategy = SiblingMerge(pool, reflection_lm, adapter.MERGE_FORMATS,
                                proposer=reflection if reflection.custom_instructions else None,
                                code_components=code_components, keep_best=selection == "merge+best", events=events)
    else:
        strategy = selections.strategy(selection)
    selector = candidate_selection_strategy
    return GepaParts(
        rng=rng, candidate_selector=CANDIDATE_SELECTORS[selector](rng) if isinstance(selector, str) else selector,
        sampler=sampler, component_selector=component_selector(selected_component), reflection=reflection,
        selection=strategy,
    )


def degraded(parts: GepaParts) -> bool:
    """Whether the run's selection can no longer merge (its merges came back unreadable): the schedules then run
    one proposal at a time, as dspy.GEPA does (``dspy_pxn.proposer.sibling_merge.SiblingMerge``)."""
    return bool(getattr(parts.selection, "degraded", False))
