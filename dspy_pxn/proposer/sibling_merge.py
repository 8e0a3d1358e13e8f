"""Sibling merge: a step's improving children combined into one candidate, which is validated.

At a fixed budget a search with k proposals per step gets about (proposals) / k steps, whatever the schedule, and a
16-wide step that validates its improving children one by one spends the budget on near-duplicates: each child
carries one lesson, and the next step starts from one of them. Merging turns that breadth into depth: one
reflection call reads every improving child's rewrite and the feedback that produced it and writes one instruction
that keeps all of their improvements (per component). gepa's own merge cannot: it crosses whole components between
two candidates, so two lessons in the same instruction never meet.

gepa's engine has no seam for a selection strategy to add a candidate of its own (it drops proposals not from the
list it passed in), so ``SiblingMerge`` hands the merged candidate back *in* one of the improving proposals,
rewriting its candidate and parents (tag ``"sibling_merge"``) before gepa validates it. The merge costs reflection
LM calls only; its validation is |val| metric calls like any child's, inside the budget guard. (gepa's
``use_merge=True`` is the *crossover*.)
"""

from __future__ import annotations

import difflib
import logging
import re
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import dspy
from dspy.utils.exceptions import AdapterParseError
from gepa.core.state import GEPAState
from gepa.proposer.base import CandidateProposal
from gepa.strategies.acceptance import AcceptanceCriterion
from gepa.strategies.instruction_proposal import InstructionProposalSignature

from dspy_pxn.engine.candidates import best_program, improvement, ties_the_best
from dspy_pxn.engine.events import StepEvents
from dspy_pxn.ledger.ledger import REFLECTING
from dspy_pxn.pools import WorkerPool
from dspy_pxn.proposer.reflection import DATASET_KEY, FEEDBACK_KEY, first_text

logger = logging.getLogger(__name__)

MERGE_TAG = "sibling_merge"
MAX_FEEDBACK_CHARS = 4000  # per rewrite: the merge prompt must stay a prompt, however long the feedback was
MAX_LESSONS = 16  # distinct changes a merge prompt shows, the best supported: at most ~64k characters of feedback


class MergeImprovements(dspy.Signature):
    """Several rewrites each improved a program on their own examples: each fixed different failures,
    guided by the feedback shown with it, by changing the instruction it was written from (the lines it
    removed and added are shown; a change several rewrites made independently is shown once, with how
    many made it, and the best-supported changes come first). Write ONE instruction that starts from the
    current best instruction and adds every improvement of every rewrite (all the rules, facts, formats
    and corrections they added), drops nothing that made a rewrite better, resolves contradictions in
    favour of the change more rewrites made and whose feedback supports it, and, if it cannot hold
    everything, keeps the best-supported changes. Output only the instruction."""

    current_instruction: str = dspy.InputField(desc="The current best instruction: the merge starts from it.")
    improved_instructions: str = dspy.InputField(desc="Each improving rewrite: its minibatch score before -> after, "
                                                 "the lines it changed, and the feedback that led to it.")
    merged_instruction: str = dspy.OutputField(desc="One instruction carrying all the improvements.")


CHANGES_HEADER = "It changed the instruction it was written from as follows (- removed, + added):"

# A sentence: up to its end mark and the spaces after it, or up to the end of its line (the newline kept).
SENTENCE = re.compile(r"[^\n]*?(?:[.!?](?=\s)\s*|\n|$)")
WORD = re.compile(r"\S+\s*|\s+")
# Text this long (a run-on sentence, a rewritten paragraph) is compared in runs of about RUN_WORDS words, and a
# changed stretch this long (up to REWRITTEN_CHARS) again word by word.
LONG_CHANGE_CHARS = 400
RUN_WORDS = 12
# A changed stretch longer than this was rewritten, not edited: it is shown whole.
REWRITTEN_CHARS = 2000


def changes(before: str, after: str) -> str:
    """What a rewrite removed and added (``- `` and ``+ `` lines): its lesson, without what it inherited.

    A rewrite of an older candidate also carries that candidate's text, which the pool's best may since have
    corrected; showing only the changes keeps old text from outvoting new lessons. The texts are compared
    sentence by sentence, and a long changed stretch word by word, never character by character: GEPA's
    instructions grow to thousands of characters, often on one line, and a character diff of two such lines
    takes seconds and shows whole texts, where this takes milliseconds (the common start and end are set
    aside first, in one pass, so the cost is in proportion to the text).
    """
    lines: list[str] = []
    for removed, added in _changed(units(before), units(after)):
        if LONG_CHANGE_CHARS < max(len(removed), len(added)) <= REWRITTEN_CHARS:
            pairs = _changed(_pieces(WORD, removed), _pieces(WORD, added))
        else:
            pairs = [(removed, added)]
        for old, new in pairs:
            lines.extend(f"- {line.strip()}" for line in old.splitlines() if line.strip())
            lines.extend(f"+ {line.strip()}" for line in new.splitlines() if line.strip())
    return "\n".join(lines)


def _pieces(pattern: re.Pattern[str], text: str) -> list[str]:
    """``text`` cut into pieces that join back into it."""
    return [piece for piece in pattern.findall(text) if piece]


def units(text: str) -> list[str]:
    """``text`` cut into sentences, and a sentence too long to be one change (a run-on instruction) into runs of
    words that end where a word's content says (about one word in ``RUN_WORDS``), so an insertion anywhere leaves
    the runs after it as they were. The pieces join back into the text."""
    out: list[str] = []
    for sentence in _pieces(SENTENCE, text):
        if len(sentence) <= LONG_CHANGE_CHARS:
            out.append(sentence)
            continue
        run: list[str] = []
        for word in _pieces(WORD, sentence):
            run.append(word)
            if zlib.crc32(word.strip().encode()) % RUN_WORDS == 0:
                out.append("".join(run))
                run = []
        if run:
            out.append("".join(run))
    return out


def _changed(old: list[str], new: list[str]) -> list[tuple[str, str]]:
    """(removed, added) text of each stretch where ``new`` differs from ``old``, pieces compared without their
    trailing space."""
    start = 0
    while start < min(len(old), len(new)) and old[start].rstrip() == new[start].rstrip():
        start += 1
    end = 0
    while end < min(len(old), len(new)) - start and old[-1 - end].rstrip() == new[-1 - end].rstrip():
        end += 1
    old_middle, new_middle = old[start:len(old) - end], new[start:len(new) - end]
    matcher = difflib.SequenceMatcher(None, [p.rstrip() for p in old_middle], [p.rstrip() for p in new_middle],
                                      autojunk=False)
    return [("".join(old_middle[i1:i2]), "".join(new_middle[j1:j2]))
            for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]


@dataclass(frozen=True)
class Lesson:
    """One distinct change to a component, and how many improving rewrites made it.

    A wide pool brings a merge dozens of improving rewrites (59 in one window at W = 256), many of them the same
    change: the lesson the commonest failure teaches. Shown once each, best supported first, the prompt stays a
    prompt, and a model that cannot keep every change keeps the ones most rewrites found independently (with 40%
    copy errors in the simulated reflector, the correct copy of a rule is the one most rewrites agree on).
    """

    change: str
    support: int
    scores: str  # the minibatch score change of its best rewrite
    feedback: str  # the feedback its best rewrite was written from


def lessons(rewrites: Sequence[tuple[str, str, str]]) -> list[Lesson]:
    """(score change, change, feedback) per rewrite, best first -> distinct changes, most supported first
    (ties keep the rewrites' order), at most ``MAX_LESSONS``."""
    support = Counter(change for _, change, _ in rewrites)
    first: dict[str, tuple[str, str]] = {}
    for scores, change, feedback in rewrites:
        first.setdefault(change, (scores, feedback))
    ranked = sorted(first, key=lambda change: -support[change])  # stable: ties stay best rewrite first
    return [Lesson(change, support[change], *first[change]) for change in ranked[:MAX_LESSONS]]


def render_rewrites(rewrites: Sequence[tuple[str, str, str]]) -> str:
    """(score change, changes, feedback) per rewrite, as the merge prompt shows them: one block per lesson."""
    blocks = []
    for number, lesson in enumerate(lessons(rewrites), 1):
        feedback = lesson.feedback[:MAX_FEEDBACK_CHARS] or "(none recorded)"
        made_by = f"made by {lesson.support} of the {len(rewrites)} rewrites; " if lesson.support > 1 else ""
        blocks.append(f"### Rewrite {number} ({made_by}minibatch {lesson.scores})\n{CHANGES_HEADER}\n"
                      f"{lesson.change}\nFeedback that led to it:\n{feedback}")
    return "\n\n".join(blocks)


def _scores(proposal: CandidateProposal) -> str:
    before = sum(proposal.subsample_scores_before or [])
    after = sum(proposal.subsample_scores_after or [])
    size = len(proposal.subsample_scores_after or [])
    return f"{before:g}/{size} -> {after:g}/{size}"


def _feedback(proposal: CandidateProposal, component: str) -> str:
    return str((proposal.metadata or {}).get(FEEDBACK_KEY, {}).get(component, ""))


class MergeUnwritten(Exception):
    """No reply to a sibling merge could be read as an instruction, in any form this run asks for it."""


def merge_as_dspy_fields(lm: dspy.BaseLM, current: str, shown: str) -> str:
    """The merge as a DSPy signature (``MergeImprovements``): DSPy's chat format, which falls back to JSON itself."""
    try:
        with dspy.context(lm=lm, **{REFLECTING: True}):
            reply = dspy.Predict(MergeImprovements)(current_instruction=current, improved_instructions=shown)
    except AdapterParseError as error:
        raise MergeUnwritten(f"DSPy's chat and JSON formats: {str(error).splitlines()[0]}") from None
    return (reply.merged_instruction or "").strip()


PLAIN_MERGE_PROMPT = """{task}

The current best instruction:
```
{current}
```

The improving rewrites:

{shown}

Write the new instruction within ``` blocks."""


def merge_as_plain_text(lm: dspy.BaseLM, current: str, shown: str) -> str:
    """The merge as one plain prompt whose reply holds the instruction between ``` marks, as gepa's own reflection
    prompt asks (and reads it with gepa's own extractor); a reply without them is not read."""
    prompt = PLAIN_MERGE_PROMPT.format(task=" ".join(MergeImprovements.__doc__.split()), current=current, shown=shown)
    with dspy.context(**{REFLECTING: True}):
        reply = first_text(lm(prompt)[0])
    if reply.count("```") < 2:
        raise MergeUnwritten("plain text: the reply holds no ``` block")
    return InstructionProposalSignature.output_extractor(reply)["new_instruction"].strip()


# How a merge is asked for, per reply format: (LM, current instruction, the rewrites as shown) -> text.
MERGE_FORMATS: dict[str, Callable[[dspy.BaseLM, str, str], str]] = {"dspy": merge_as_dspy_fields,
                                                                      "plain": merge_as_plain_text}


class SiblingMerge:
    """A gepa selection strategy: validate the merge of a step's improving children (and, with
    ``keep_best``, the best child itself, so a merge that lost something cannot cost the step).

    The merge is written into the pool's best candidate, so even a lone improving child is merged when
    it was rewritten from another candidate; a lone child of the best itself is validated as it is. A
    component's merge is written by a user's own proposer where the run has one (``proposer``, a
    PooledReflection: every instruction the run validates is one it wrote), else by the reflection LM
    from our prompt, asked in each of ``formats`` in turn until a reply is read (first the format the
    reflection LM already answers in: DSPy's for a DSPy program, gepa's plain text for an MLflow prompt).

    A merge no reply to which can be read (``MergeUnwritten``) would leave every window with one lesson
    and the search behind the serial one: from then on the run is ``degraded``, the schedules run one
    proposal at a time, and every improving child is validated, as dspy.GEPA does.
    """

    def __init__(self, pool: WorkerPool, reflection_lm: dspy.BaseLM | None = None,
                 formats: Sequence[str] = ("dspy", "plain"), proposer: Any = None,
                 code_components: Sequence[str] = (), keep_best: bool = False, events: StepEvents | None = None):
        self.pool, self.reflection_lm, self.formats, self.proposer = pool, reflection_lm, tuple(formats), proposer
        self.code_components, self.keep_best = set(code_components), keep_best
        self.events = events or StepEvents()
        self.degraded = False  # a merge came back unreadable: one proposal at a time from then on

    def select(self, proposals: list[CandidateProposal], state: GEPAState,
               acceptance_criterion: AcceptanceCriterion) -> list[CandidateProposal]:
        improving = sorted((p for p in proposals if acceptance_criterion.should_accept(p, state)), key=improvement,
                           reverse=True)
        if self.degraded or not improving:
            return improving  # one proposal at a time validates every improving child
        start = time.perf_counter()
        parents = [state.program_candidates[p.parent_program_ids[0]] for p in improving]
        # The base: the pool's best, or on a tie for it, the first improving child's own parent (the candidate its
        # lessons were learned on, often the newest of those tied).
        current = [p for p in improving if ties_the_best(state, p.parent_program_ids[0])]
        base = current[0].parent_program_ids[0] if current else best_program(state)
        try:
            merged = self.merge(improving, parents, state.program_candidates[base])
        except MergeUnwritten as unread:
            self.degraded = True
            logger.warning("The sibling merge's reply could not be read (%s): from now on the run searches one "
                           "proposal at a time and validates every improving child, as dspy.GEPA does.", unread)
            return improving
        if merged in state.program_candidates:
            # The merge added nothing the pool lacks (a model that cannot fit more into a full instruction returns it
            # as it was): the best child not already in the pool stands alone, a child of a best candidate first. A
            # child that is a pool candidate's very text (where each improvement builds on the last, pipelines
            # started from an older candidate learn what the best already knows) would spend |val| on a duplicate.
            fresh = sorted((p for p in improving if p.candidate not in state.program_candidates),
                           key=lambda p: not any(p is c for c in current))
            logger.info("The merge of %d improving children is already in the pool; %s.", len(improving),
                        "validating the best child" if fresh else "each child is already in the pool")
            return fresh[:1]
        if merged == improving[0].candidate:
            return improving[:1]  # one child rewritten from the best itself: it is the merge
        self.events.sibling_merged(time.perf_counter() - start, len(improving))
        keep_best = self.keep_best and len(improving) >= 2  # a lone child from an older parent: its merge alone
        carrier = improving[1] if keep_best else improving[0]
        sources = [p.metadata.get("proposal_id") for p in improving]
        carrier.candidate = merged
        carrier.parent_program_ids = list(dict.fromkeys([base, *(i for p in improving for i in p.parent_program_ids)]))
        carrier.tag = MERGE_TAG
        carrier.metadata = {**(carrier.metadata or {}), "merged_from": sources}
        return [improving[0], carrier] if keep_best else [carrier]

    def merge(self, improving: Sequence[CandidateProposal], parents: Sequence[dict[str, str]],
              base: dict[str, str]) -> dict[str, str]:
        """Every improving child's lessons (best first; ``parents[i]`` is the candidate ``improving[i]`` was
        rewritten from) written into ``base``, the best candidate in the pool; ``MergeUnwritten`` when a
        component's merge could not be read.

        A lesson is a component a child changed from its own parent. Building on the pool's best, not on the
        children's parent, is what turns breadth into depth: the merged candidate keeps everything the best
        knew and adds what this step's children learned, even when they were rewritten from older candidates
        (the asynchronous schedule's pipelines often are).
        """
        merged = dict(base)
        jobs: list[tuple[str, list[tuple[str, str, str]], list[CandidateProposal]]] = []
        for component in base:
            changed = [(proposal, parent) for proposal, parent in zip(improving, parents, strict=True)
                       if proposal.candidate.get(component) != parent.get(component)]
            if not changed:
                continue
            (best, its_parent), lone = changed[0], len(changed) == 1
            if component in self.code_components or (lone and its_parent.get(component) == base.get(component)):
                # Program source is not merged as prose, and one lesson on top of what base already has is the
                # merge: the best rewrite stands.
                merged[component] = best.candidate[component]
                continue
            rewrites = [(_scores(p), changes(parent[component], p.candidate[component]), _feedback(p, component))
                        for p, parent in changed]
            jobs.append((component, rewrites, [p for p, _ in changed]))
        written = self.pool.map_local(lambda job: self._merge_one(base, *job), jobs)
        for (component, _, changed), text in zip(jobs, written, strict=True):
            if isinstance(text, MergeUnwritten):
                raise text
            merged[component] = text if text else changed[0].candidate[component]
        return merged

    def _merge_one(self, base: dict[str, str], component: str, rewrites: list[tuple[str, str, str]],
                   changed: list[CandidateProposal]) -> str | MergeUnwritten | None:
        """One component's merge; None where the call failed (the best rewrite stands for it), the
        ``MergeUnwritten`` where a reply came back that could not be read."""
        try:
            return self.write(component, base, rewrites, changed)
        except MergeUnwritten as unread:
            return unread
        except Exception as error:  # noqa: BLE001 - a failed call (a timeout, a provider error) leaves the best rewrite
            logger.warning("Merging %d rewrites of %s failed; keeping the best one: %s: %s",
                           len(rewrites), component, type(error).__name__, error)
            return None

    def write(self, component: str, base: dict[str, str], rewrites: list[tuple[str, str, str]],
              improving: Sequence[CandidateProposal]) -> str:
        """``base``'s ``component`` with every rewrite's lesson in it; ``MergeUnwritten`` where no reply was read."""
        if self.proposer is not None:  # the pool's best rewritten from every improving child's reflective dataset
            dataset = [item for proposal in improving
                       for item in ((proposal.metadata or {}).get(DATASET_KEY) or {}).get(component, [])]
            proposal = self.proposer.propose((dict(base), {component: dataset}, [component]))
            if text := (proposal.new_texts or {}).get(component):
                return text
            raise MergeUnwritten(
                f"the instruction proposer: {(proposal.metadata or {}).get('reflection_error', 'no text')}")
        lm, shown, unread = self.reflection_lm or dspy.settings.lm, render_rewrites(rewrites), []
        for name in self.formats:
            try:
                if text := MERGE_FORMATS[name](lm, base[component], shown):
                    return text
                unread.append(f"{name}: an empty instruction")
            except MergeUnwritten as error:
                unread.append(str(error))
        raise MergeUnwritten("; ".join(unread))
