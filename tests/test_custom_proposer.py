"""A user's own instruction proposer writes every instruction a wide run validates, and no prompt of ours reaches an LM.

dspy.GEPA lets a custom ``instruction_proposer`` write every instruction; with several proposals in flight the
sibling merge must then be the proposer's too (``dspy_pxn.proposer.sibling_merge.SiblingMerge.write``), and with ``reflection_lm=None``
(which dspy.GEPA accepts beside a proposer) the task LM must hear nothing but the program's own calls.
"""

from __future__ import annotations

from typing import Any

import dspy
import pytest
from dspy.teleprompt.gepa.instruction_proposal import InstructionProposer

from dspy_pxn import BatchedGEPA
from tests.compiling import compile_sim
from tests.zoo.lm import ZooLM
from tests.zoo.shapes import SHAPES

# p="auto" on 4 workers with |val| = 5 at this budget runs several proposals at once (tests/test_zoo.py).
MAX_METRIC_CALLS = 400
SHAPE_NAMES = ("predict", "two_stage", "chain_of_thought", "per_predictor_lms")
# What only our own prompts ask for (the sibling merge in both its forms) and DSPy's own reflection prompt.
OURS_OR_DSPYS = ("merged_instruction", "The improving rewrites:", "new_instruction")


class RecordingProposer:
    """A user's proposer: DSPy's own proposal logic on the user's own LM, every text it returns recorded."""

    def __init__(self) -> None:
        self.lm = ZooLM("users-proposer-lm")
        self.wrote: list[str] = []
        self.calls = 0

    def __call__(self, candidate: dict[str, str], reflective_dataset: dict[str, Any],
                 components_to_update: list[str]) -> dict[str, str]:
        self.calls += 1
        with dspy.context(lm=self.lm):
            texts = InstructionProposer()(candidate, reflective_dataset, components_to_update)
        texts = {name: f"{text}\n(v{self.calls})" for name, text in texts.items()}  # each text unique
        self.wrote.extend(texts.values())
        return texts


class PromptsSeen(ZooLM):
    """The task LM, keeping every prompt it was sent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prompts: list[str] = []

    def respond(self, messages: list[dict[str, Any]]) -> tuple[str, str]:
        self.prompts.append(" ".join(str(m.get("content")) for m in messages))
        return super().respond(messages)


@pytest.mark.parametrize("shape", [s for s in SHAPES if s.name in SHAPE_NAMES], ids=lambda s: s.name)
def test_a_wide_run_validates_only_instructions_the_users_proposer_wrote(shape):
    # Whether a window validates a merge rather than a lone child depends on how the pipelines' timings fall (a
    # loaded machine finishes them one by one): the run is repeated on the next seed, up to three, until one has.
    for seed in range(3):
        proposer, task_lm = RecordingProposer(), PromptsSeen()
        train, val = shape.data()
        student = shape.program()
        seed_texts = {predictor.signature.instructions for _, predictor in student.named_predictors()}
        result = compile_sim(student, (train, val), optimizer=BatchedGEPA, metric=shape.metric, lm=task_lm,
                             reflection_lm=None, instruction_proposer=proposer, max_metric_calls=MAX_METRIC_CALLS,
                             num_threads=4, seed=seed).results
        merges = sum(step.sibling_merged > 0 for step in result.steps)
        if merges:
            break
    assert result.steps[0].p * result.steps[0].n > 1, "the defaults should run several proposals at once"
    assert merges >= 1, "no sibling merge was validated: the test would not see who writes them"
    assert proposer.calls >= sum(step.proposals for step in result.steps) + merges  # the merges were its calls
    validated = {predictor.signature.instructions for candidate in result.candidates
                 for _, predictor in candidate.named_predictors()}
    assert validated - seed_texts, "the run found nothing to validate: the test would be vacuous"
    assert validated <= seed_texts | set(proposer.wrote), validated - seed_texts - set(proposer.wrote)
    leaked = [prompt[:200] for prompt in task_lm.prompts if any(mark in prompt for mark in OURS_OR_DSPYS)]
    assert not leaked, leaked


def test_a_merge_the_proposer_writes_reads_every_improving_childs_feedback():
    """The merge is the pool's best rewritten by the proposer from all the improvers' reflective datasets."""
    from gepa.proposer.base import CandidateProposal

    from dspy_pxn.proposer.reflection import DATASET_KEY
    from dspy_pxn.proposer.sibling_merge import SiblingMerge

    asked = []

    class Reflection:
        def propose(self, job):
            asked.append(job)
            from gepa.proposer.reflective_mutation.reflection_lm import ReflectionProposal

            return ReflectionProposal(new_texts={"predict": "merged by the proposer"})

    children = [CandidateProposal(candidate={"predict": f"child {i}"}, parent_program_ids=[0],
                                  metadata={DATASET_KEY: {"predict": [{"Feedback": f"lesson {i}"}]}})
                for i in range(3)]
    text = SiblingMerge(pool=None, proposer=Reflection()).write("predict", {"predict": "best"}, [], children)
    assert text == "merged by the proposer"
    (base, dataset, components), = asked
    assert base == {"predict": "best"} and components == ["predict"]
    assert [item["Feedback"] for item in dataset["predict"]] == ["lesson 0", "lesson 1", "lesson 2"]


def test_a_wide_run_validates_only_code_the_users_code_proposer_wrote(task_lm, splits):
    """dspy.Flex source is never merged as prose: in a merge the best rewrite stands, and with a custom
    ``code_proposer`` every rewrite is the proposer's."""
    from dspy.teleprompt.gepa.gepa_flex_utils import propose_code

    from dspy_pxn import testing as sim
    from tests.test_drop_in import flex

    wrote: list[str] = []
    proposer_lm = sim.SimulatedLM(reflection_error_rate=0.0)

    def code_proposer(*, candidate, reflective_dataset, components_to_update, task_descriptions, context_blurbs):
        texts = propose_code(components_to_update, candidate, reflective_dataset, task_descriptions, context_blurbs,
                             proposer_lm)
        wrote.extend(texts.values())
        return texts

    program = flex()
    seed_source = program.module_src
    result = BatchedGEPA(metric=sim.metric, reflection_lm=None, code_proposer=code_proposer, p=3, n=1,
                         max_metric_calls=150).compile(program, trainset=splits.train, valset=splits.val).detailed_results
    sources = {candidate.module_src for candidate in result.candidates}
    assert len(sources) > 1 and sources <= {seed_source, *wrote}
