"""Pooled reflection: every reflection of a step at once, dspy's own proposer per call, failures contained."""

import threading

import dspy
from dspy.teleprompt.gepa.instruction_proposal import InstructionProposer

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim
from dspy_pxn.engine.events import StepEvents, StepListener, override
from dspy_pxn.pools import ThreadWorkerPool
from dspy_pxn.proposer.reflection import FEEDBACK_KEY, PooledReflection, mutation_rollout_ids
from dspy_pxn.targets.program.adapter import BatchedAdapter
from tests.compiling import reflection_prompts
from tests.conftest import seed_program

REFLECTIVE = {"predict": [{"Inputs": {"question": "Apply rule zorp to 3."}, "Generated Outputs": {"answer": "3"},
                           "Feedback": "Wrong: expected 10. Rule definition: zorp(x) = 3*x + 1."}]}


class Reflections(StepListener):
    def __init__(self):
        self.heard: list[tuple[int, int]] = []

    @override
    def reflected(self, seconds, jobs, failed):
        self.heard.append((jobs, failed))


def adapter_with(pool, **kwargs):
    return BatchedAdapter(student_module=seed_program(), metric_fn=sim.metric, feedback_map={}, pool=pool, **kwargs)


def test_repeated_parents_get_distinct_rollout_ids():
    a, b = {"x": "a"}, {"x": "b"}
    jobs = [(a, {}, ["x"]), (a, {}, ["x"]), (b, {}, ["x"]), (dict(a), {}, ["x"])]
    assert mutation_rollout_ids(jobs) == [None, 1, None, 2]


def test_a_failed_reflection_drops_only_its_proposal_and_is_reported():
    builtin = InstructionProposer()

    def flaky_proposer(candidate, reflective_dataset, components_to_update):
        if candidate["predict"] == "Instruction 1.":
            raise RuntimeError("provider returned 500")
        return builtin(candidate, reflective_dataset, components_to_update)

    heard = Reflections()
    with ThreadWorkerPool(3) as pool:
        reflection = PooledReflection(adapter_with(pool, custom_instruction_proposer=flaky_proposer),
                                      sim.SimulatedLM(), pool, StepEvents([heard]))
        jobs = [({"predict": f"Instruction {i}."}, REFLECTIVE, ["predict"]) for i in range(3)]
        proposals = [p for p, _ in reflection.reflect_many(jobs)]
    assert [bool(p.new_texts) for p in proposals] == [True, False, True]
    assert heard.heard == [(3, 1)]
    assert "provider returned 500" in proposals[1].metadata["reflection_error"]
    assert all("zorp(x) =" in p.new_texts["predict"] for p in proposals if p.new_texts)


def test_a_rewrite_carries_the_feedback_it_was_made_from():
    with ThreadWorkerPool(1) as pool:
        proposal = PooledReflection(adapter_with(pool), sim.SimulatedLM(), pool).propose(
            ({"predict": "Instruction."}, REFLECTIVE, ["predict"]))
    assert proposal.metadata[FEEDBACK_KEY]["predict"] == "- Wrong: expected 10. Rule definition: zorp(x) = 3*x + 1."


def test_one_reflection_runs_in_its_callers_thread_never_on_a_rollout_worker():
    """The async schedule's pipelines reflect while every worker may be busy with rollouts."""
    worker_busy, release = threading.Event(), threading.Event()
    with ThreadWorkerPool(1) as pool:
        blocker = threading.Thread(target=lambda: pool.map(lambda _: (worker_busy.set(), release.wait(30)), [0]))
        blocker.start()
        assert worker_busy.wait(30)
        try:  # the only worker is held: a reflection that needed it would wait for `release`
            proposal = PooledReflection(adapter_with(pool), sim.SimulatedLM(), pool).propose(
                ({"predict": "Instruction."}, REFLECTIVE, ["predict"]))
        finally:
            release.set()
            blocker.join()
    assert "zorp(x) =" in proposal.new_texts["predict"]


def test_all_reflections_of_a_step_run_concurrently(splits):
    reflection_lm = sim.SimulatedLM(reflection_latency=0.3)
    train, val, _ = splits
    with dspy.context(lm=sim.SimulatedLM()):
        result = BatchedGEPA(metric=sim.metric, p=2, n=2, max_metric_calls=80, reflection_lm=reflection_lm,
                             num_threads=8, schedule="steps", selection="all").compile(
            seed_program(), trainset=train, valset=val).detailed_results
    stats = reflection_lm.stats()
    widths = [s.width for s in result.steps]
    assert stats["calls"]["reflection"] >= sum(widths) - sum(s.reflection_failures for s in result.steps)
    # The 4 reflections of a step overlap: the model saw 4 calls in flight at once.
    assert stats["max_in_flight"]["reflection"] == 4 == max(widths)


def test_feedback_text_reads_dspy_feedback_and_mlflow_rationales():
    """The sibling merge shows each rewrite's feedback: DSPy's reflective datasets say 'Feedback', MLflow prompt
    rows carry the scorers' rationales."""
    from dspy_pxn.proposer.reflection import feedback_text

    dataset = {"qa": [{"Feedback": "name the unit"}, {"rationales": {"correct": "frim is 2x+7", "tone": None}},
                      {"rationales": {}}, "not a row"]}
    assert feedback_text(dataset, "qa") == "- name the unit\n- frim is 2x+7"
    assert feedback_text(dataset, "other") == ""


def test_gepas_step_loop_screens_wide_proposals_on_a_quarter_of_val_and_reflection_reads_the_three_lowest():
    """In gepa's step loop the default screens on 8 examples at |val| = 30; each reflection prompt shows 3 of them
    (dspy.GEPA's count), the lowest-scoring: rows the parent already gets right are left out while failures remain.
    (The async schedule screens in stages instead: ``tests/test_async.py``.)"""
    import dspy

    from dspy_pxn import BatchedGEPA

    train, val, _ = sim.make_splits(seed=0, train=60, val=30, test=1)
    reflection_lm = sim.SimulatedLM()
    with dspy.context(lm=sim.SimulatedLM()):
        results = BatchedGEPA(metric=sim.metric, max_metric_calls=400, num_threads=8, p=3, schedule="steps",
                              reflection_lm=reflection_lm).compile(sim.seed_program(), trainset=train,
                                                                   valset=val).detailed_results
    assert {(step.minibatch_size, step.p) for step in results.steps} == {(8, 3)}
    prompts = reflection_prompts(reflection_lm)
    assert prompts and all(prompt.count('"Feedback"') == 3 for prompt in prompts)
    # The seed gets few rows right: the three shown are failures, whose feedback names the rule to learn.
    assert all(prompt.count("Rule definition:") == 3 for prompt in prompts[:3])


def test_a_given_minibatch_is_screened_and_read_whole_at_any_width():
    import dspy

    from dspy_pxn import BatchedGEPA

    train, val, _ = sim.make_splits(seed=0, train=60, val=30, test=1)
    reflection_lm = sim.SimulatedLM()
    with dspy.context(lm=sim.SimulatedLM()):
        results = BatchedGEPA(metric=sim.metric, max_metric_calls=400, num_threads=8, p=3, reflection_minibatch_size=5,
                              reflection_lm=reflection_lm).compile(sim.seed_program(), trainset=train,
                                                                   valset=val).detailed_results
    assert {step.minibatch_size for step in results.steps} == {5}
    assert all(prompt.count('"Feedback"') == 5 for prompt in reflection_prompts(reflection_lm))


def test_reflection_reads_the_lowest_scoring_rows_in_their_order():
    from dspy_pxn.engine.pooled_adapter import reflection_rows

    assert reflection_rows([1.0, 0.0, 1.0, 0.5, 1.0, 0.0, 1.0, 1.0], 3) == [1, 3, 5]
    assert reflection_rows([1.0, 1.0, 1.0, 1.0], 3) == [0, 1, 2]  # ties: the earlier rows
    assert reflection_rows([0.0, 1.0], 3) is None and reflection_rows([0.0] * 8, None) is None
