"""All P·N reflection calls of a step at once, on the run's worker pool.

gepa runs an adapter's ``propose_new_texts`` once per task in a loop, so a step's P·N reflection
calls take P·N round trips. gepa also accepts a ``ReflectionLM`` strategy with ``reflect_many``;
this one fans the jobs out on the pool, each to the adapter's ``propose`` (for a DSPy program,
dspy's own ``DspyAdapter.propose_new_texts``, so the prompts and parsing are exactly dspy.GEPA's).
"""

from __future__ import annotations

import copy
import functools
import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import dspy
from dspy.teleprompt.gepa import instruction_proposal
from gepa.proposer.reflective_mutation.reflection_lm import ReflectionJob, ReflectionProposal

from dspy_pxn.engine.events import StepEvents
from dspy_pxn.engine.pooled_adapter import PooledAdapter
from dspy_pxn.ledger import feed
from dspy_pxn.ledger.ledger import REFLECTING
from dspy_pxn.pools import WorkerPool

logger = logging.getLogger(__name__)

# ReflectionProposal.metadata[FEEDBACK_KEY][component]: the feedback a rewrite was made from. gepa copies
# a reflection's metadata into its proposal, so a sibling merge (dspy_pxn.proposer.sibling_merge) can show it; and
# [DATASET_KEY]: the reflective dataset itself, from which a user's own proposer writes a merge.
FEEDBACK_KEY = "feedback"
DATASET_KEY = "reflective_dataset"


def first_text(reply: Any) -> str:
    """The text of an LM's first completion (a string, or a dict with ``text`` from a reasoning model)."""
    return reply.get("text", "") if isinstance(reply, dict) else str(reply)


def feedback_text(reflective_dataset: Any, component: str) -> str:
    """The feedback lines a rewrite of ``component`` was made from: a DSPy reflective dataset's 'Feedback', or
    the scorers' rationales of an MLflow prompt's (``rationales``: scorer -> text)."""
    lines = []
    for item in (reflective_dataset or {}).get(component, []) or []:
        if not hasattr(item, "get"):
            continue
        feedback = item.get("Feedback")
        if not feedback and isinstance(item.get("rationales"), dict):
            feedback = " ".join(str(text) for text in item["rationales"].values() if text)
        if feedback:
            lines.append(f"- {feedback}")
    return "\n".join(lines)


def mutation_rollout_ids(jobs: Sequence[ReflectionJob]) -> list[int | None]:
    """Give the k-th repeat of a parent within one step ``rollout_id=k``.

    Without it, two mutations of one parent on the same reflective data are the same LM request and
    DSPy's cache answers the second with the first one's text. The first keeps no rollout id, so a 1×1
    run sends exactly dspy.GEPA's requests (and hits the same cache entries).
    """
    seen: Counter[str] = Counter()
    ids: list[int | None] = []
    for candidate, _, _ in jobs:
        key = repr(sorted(candidate.items()))
        ids.append(seen[key] or None)
        seen[key] += 1
    return ids


def reflect(adapter: PooledAdapter, job_and_lm: tuple[ReflectionJob, dspy.BaseLM | None]) -> ReflectionProposal:
    """One reflection LM call, for the pool: the job's proposal under DSPy's own context for it (``lm``; the
    callbacks as they are), with the reflection LM's raw replies (gepa's trackers' ``raw_lm_outputs``).

    Picklable with ``adapter`` bound (it travels without its driver-only state), so a remote pool can run it on
    its workers; the reflective dataset is built on the driver, which holds the optimizer's state, and travels
    with the job."""
    (candidate, reflective_dataset, components), lm = job_and_lm
    adapter = copy.copy(adapter)  # this job's reflection LM (DSPy 3.4.0's proposer reads it from the adapter)
    adapter.reflection_lm = lm
    try:
        with dspy.context(lm=lm, **{REFLECTING: True}), feed.hearing_replies() as replies:
            new_texts = adapter.propose(candidate, reflective_dataset, components)
    except Exception as error:  # noqa: BLE001 - one failed reflection drops one proposal
        return ReflectionProposal(new_texts={}, metadata={"reflection_error": f"{type(error).__name__}: {error}"})
    feedback = {component: feedback_text(reflective_dataset, component) for component in new_texts}
    if len(replies) == len(new_texts):  # dspy's proposer asks once per component, in order
        raw = dict(zip(new_texts, replies, strict=True))
    else:
        raw = {component: "\n\n".join(replies) for component in new_texts}
    return ReflectionProposal(new_texts=new_texts, raw_lm_outputs=raw,
                              metadata={FEEDBACK_KEY: feedback, DATASET_KEY: reflective_dataset})


class PooledReflection:
    """gepa ``ReflectionLM`` that proposes every job of a step concurrently.

    A job whose reflection raises (rate limit, malformed output) yields an empty proposal: gepa then drops
    that proposal only, and the failure is logged and reported (``StepEvents.reflected``). With dspy's
    built-in proposers, reflection calls run where the pool runs rollouts; a custom proposer's stay here.
    """

    def __init__(self, adapter: PooledAdapter, reflection_lm: dspy.BaseLM | None, pool: WorkerPool,
                 events: StepEvents | None = None):
        self.adapter, self.reflection_lm, self.pool = adapter, reflection_lm, pool
        self.events = events or StepEvents()
        self._warned_zero_temperature = False
        self._call = functools.partial(reflect, adapter)
        self._call.reflects = True  # type: ignore[attr-defined] # a remote pool charges it to the reflection budget
        # A user's own instruction proposer writes every instruction, the sibling merge's too. DSPy's own is an
        # InstructionProposer (3.4.1), or none (3.4.0 proposes inline).
        proposer = getattr(adapter, "custom_instruction_proposer", None)
        own = getattr(instruction_proposal, "InstructionProposer", None)
        self.custom_instructions = proposer is not None and not (own is not None and isinstance(proposer, own))
        builtin = not self.custom_instructions and getattr(adapter, "custom_code_proposer", None) is None
        self.remote = builtin and getattr(pool, "remote", False)

    def reflect(self, candidate: dict[str, str], reflective_dataset: Mapping[str, Sequence[Mapping[str, Any]]],
                components_to_update: list[str]) -> tuple[ReflectionProposal, PooledReflection]:
        return self.reflect_many([(candidate, reflective_dataset, components_to_update)])[0]

    def reflect_many(self, jobs: list[ReflectionJob]) -> list[tuple[ReflectionProposal, PooledReflection]]:
        start = time.perf_counter()
        rollout_ids = mutation_rollout_ids(jobs)
        temperature = getattr(self.reflection_lm or dspy.settings.lm, "kwargs", {}).get("temperature")
        if any(rollout_ids) and temperature == 0 and not self._warned_zero_temperature:
            self._warned_zero_temperature = True
            logger.info("reflection_lm has temperature=0: mutations of one parent differ only through their "
                        "minibatches; set temperature>0 for more diverse mutations.")
        items = [(job, self._lm(rollout_id)) for job, rollout_id in zip(jobs, rollout_ids, strict=True)]
        proposals = (self.pool.map if self.remote else self.pool.map_local)(self._call, items)
        self._report(start, proposals)
        return [(proposal, self) for proposal in proposals]

    def propose(self, job: ReflectionJob) -> ReflectionProposal:
        """One reflection, reported as a step event. The asynchronous schedule calls it from its own
        threads; on a local pool it runs right there, so reflections never hold a rollout worker."""
        start = time.perf_counter()
        item = (job, self._lm(None))
        (proposal,) = self.pool.map(self._call, [item]) if self.remote else [self._call(item)]
        self._report(start, [proposal])
        return proposal

    def _lm(self, rollout_id: int | None) -> dspy.BaseLM | None:
        lm = self.reflection_lm or dspy.settings.lm
        return lm.copy(rollout_id=rollout_id) if rollout_id is not None and lm is not None else lm

    def _report(self, start: float, proposals: list[ReflectionProposal]) -> None:
        for proposal in proposals:
            error = proposal.metadata.get("reflection_error") if proposal.metadata else None
            if error is not None:
                logger.warning("Reflection failed; dropping this proposal: %s", error)
        failed = sum(1 for p in proposals if not p.new_texts)
        self.events.reflected(time.perf_counter() - start, len(proposals), failed)
