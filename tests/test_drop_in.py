"""BatchedGEPA is a drop-in for dspy.GEPA: programs, metrics and arguments that work there work here.

Every program here runs on the in-process simulated LM (dspy_pxn.testing), which answers
a rule question right iff the rule's definition is in the predictor's instruction.
"""

import inspect
import itertools
import logging
import time

import dspy
import pytest
from dspy.primitives.local_interpreter import LocalInterpreter

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim

KNOWN = "Apply the named rule to the number and give the integer result.\n" + "\n".join(
    rule.definition for rule in sim.RULES
)


def knowing(predictor):
    """The predictor with every rule's definition in its instruction: it answers every question right."""
    predictor.signature = predictor.signature.with_instructions(KNOWN)
    return predictor


class ParallelPair(dspy.Module):
    """Two predictors called through dspy.Parallel inside forward."""

    def __init__(self):
        super().__init__()
        self.first = knowing(dspy.Predict("question -> answer"))
        self.second = knowing(dspy.Predict("question -> answer"))

    def forward(self, question):
        # No progress bar: tqdm's instance registry is not thread-safe, and dspy.Parallel bars opened from
        # many rollout threads at once crash dspy.GEPA itself now and then (KeyError on a tqdm weakref).
        first, second = dspy.Parallel(num_threads=2, disable_progress_bar=True)([
            (self.first, {"question": question}), (self.second, {"question": question})])
        return dspy.Prediction(answer=first.answer if first.answer == second.answer else "disagree")


class Batched(dspy.Module):
    """A predictor called through Module.batch inside forward."""

    def __init__(self):
        super().__init__()
        self.solve = knowing(dspy.Predict("question -> answer"))

    def forward(self, question):
        (answer,) = self.solve.batch([dspy.Example(question=question).with_inputs("question")], num_threads=2,
                                     disable_progress_bar=True)  # tqdm's registry races across threads (above)
        return dspy.Prediction(answer=answer.answer)


class NestedEvaluate(dspy.Module):
    """A predictor scored by a nested dspy.Evaluate inside forward (a self-check before answering)."""

    def __init__(self):
        super().__init__()
        self.solve = knowing(dspy.Predict("question -> answer"))

    def forward(self, question):
        probe = sim.make_examples(2, seed=99)
        check = dspy.Evaluate(devset=probe, metric=sim.score, num_threads=2, display_progress=False)(self.solve)
        answer = self.solve(question=question).answer
        return dspy.Prediction(answer=answer if check.score == 100.0 else "unsure")


def run(optimizer_class, program, splits, **kwargs):
    kwargs.setdefault("max_metric_calls", 40)
    optimizer = optimizer_class(metric=sim.metric, reflection_lm=sim.SimulatedLM(), track_stats=True, **kwargs)
    return optimizer.compile(program, trainset=splits.train, valset=splits.val[:6])


@pytest.mark.parametrize("track_usage", [False, True], ids=["", "track_usage"])  # mlflow.dspy.autolog sets it
@pytest.mark.parametrize("program_class", [ParallelPair, Batched, NestedEvaluate])
def test_programs_that_fan_out_inside_forward_score_as_under_dspy_gepa(task_lm, splits, program_class, track_usage):
    with dspy.context(track_usage=track_usage):
        upstream = run(dspy.GEPA, program_class(), splits, use_merge=False, num_threads=4)
        ours = run(BatchedGEPA, program_class(), splits, p=2, n=1, num_threads=4)
    assert upstream.detailed_results.val_aggregate_scores[0] == 1.0
    assert ours.detailed_results.val_aggregate_scores[0] == 1.0
    # The LM calls made in DSPy's worker threads are metered into the run (2 per rollout at least
    # for ParallelPair; the seed validation alone is 6 rollouts).
    assert ours.detailed_results.usage.lm_calls >= 6


def test_a_metric_reading_lm_usage_sees_it_as_under_dspy_gepa(task_lm, splits):
    seen = []

    def usage_metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
        usage = pred.get_lm_usage()
        seen.append(usage)
        return 1.0 if usage else 0.0

    program = sim.seed_program()
    with dspy.context(track_usage=True):
        best = BatchedGEPA(metric=usage_metric, reflection_lm=sim.SimulatedLM(), max_metric_calls=30).compile(
            program, trainset=splits.train, valset=splits.val[:6])
    assert best.detailed_results.val_aggregate_scores[0] == 1.0
    assert all(seen) and len(seen) >= 6
    assert best.detailed_results.usage.prompt_tokens > 0


# ----------------------------------------------------------------------------- dspy.Flex
class Question(dspy.Signature):
    """Apply the named rule to the number and give the integer result."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField()


def flex():
    return dspy.Flex(Question, interpreter_factory=LocalInterpreter)


class FlexAndPredictor(dspy.Module):
    """A Flex submodule answers; a plain predictor phrases the answer (echoing it)."""

    def __init__(self):
        super().__init__()
        self.solver = flex()
        self.echo = dspy.Predict("question -> answer")

    def forward(self, question):
        return self.solver(question=question)


def test_a_flex_only_program_has_its_code_optimized(task_lm, splits):
    program = flex()
    seed_source = program.module_src
    best = BatchedGEPA(metric=sim.metric, reflection_lm=sim.SimulatedLM(reflection_error_rate=0.0),
                       p=2, n=1, max_metric_calls=80).compile(program, trainset=splits.train, valset=splits.val)
    results = best.detailed_results
    assert results.candidates[0].module_src == seed_source
    assert max(results.val_aggregate_scores) > results.val_aggregate_scores[0]
    assert best.module_src != seed_source and "(x) = " in best.module_src


def test_a_mixed_program_optimizes_code_and_instructions(task_lm, splits):
    from dspy_pxn.targets.program.components import seed_candidate

    program = FlexAndPredictor()
    assert set(seed_candidate(program)) == {"solver", "echo"}
    calls = []

    def code_proposer(*, candidate, reflective_dataset, components_to_update, task_descriptions, context_blurbs):
        calls.append(list(components_to_update))
        return {name: candidate[name] + "\n# revised" for name in components_to_update}

    best = BatchedGEPA(metric=sim.metric, reflection_lm=sim.SimulatedLM(), code_proposer=code_proposer,
                       component_selector="all", max_metric_calls=60).compile(
        program, trainset=splits.train, valset=splits.val[:6])
    assert calls and all(update == ["solver"] for update in calls)  # only Flex code goes to the code proposer
    assert best.detailed_results.total_metric_calls <= 60


# ----------------------------------------------------------------------------- dspy.GEPA's arguments
# Defaults BatchedGEPA sets differently from dspy.GEPA, each for a reason the README gives.
DEFAULTS_DIFFERING_FROM_DSPY_GEPA = {
    "metric": None,  # the program's own metric when omitted
    "track_stats": True,  # detailed_results carry the per-step records the run is for
    "reflection_minibatch_size": None,  # dspy.GEPA's 3 at one proposal at a time; above it, chosen with the width
}


def test_every_argument_of_dspy_gepa_is_accepted_with_its_default():
    upstream = inspect.signature(dspy.GEPA.__init__).parameters
    ours = inspect.signature(BatchedGEPA.__init__).parameters
    missing = sorted(set(upstream) - set(ours))
    assert not missing, f"dspy.GEPA has arguments BatchedGEPA does not accept: {missing}"
    for name, parameter in upstream.items():
        if name == "self":
            continue
        expected = DEFAULTS_DIFFERING_FROM_DSPY_GEPA.get(name, parameter.default)
        assert ours[name].default == expected, f"default of {name}: {ours[name].default!r} vs {expected!r}"
        assert ours[name].kind in (parameter.kind, inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def test_track_stats_false_returns_no_detailed_results(task_lm, splits):
    best = BatchedGEPA(metric=sim.metric, track_stats=False, max_metric_calls=30).compile(
        sim.seed_program(), trainset=splits.train, valset=splits.val[:6])
    assert not hasattr(best, "detailed_results")


def test_use_mlflow_is_dspy_pxn_tracking(task_lm, splits, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    store = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)  # use_mlflow alone: MLflow's own default store
    best = BatchedGEPA(metric=sim.metric, max_metric_calls=30, use_mlflow=True).compile(
        sim.seed_program(), trainset=splits.train, valset=splits.val[:6])
    run = MlflowClient(store).get_run(best.detailed_results.mlflow_run_id)
    assert run.info.status == "FINISHED" and run.data.params["p"] == "1"
    with pytest.raises(ValueError, match="use_mlflow=True and tracker=False say two things"):
        BatchedGEPA(metric=sim.metric, reflection_lm=sim.SimulatedLM(), max_metric_calls=30, use_mlflow=True,
                    tracker=False)


def test_use_wandb_is_gepas_weights_and_biases_logging(task_lm, splits, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")  # a real wandb run, written to disk, no account or network
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    BatchedGEPA(metric=sim.metric, p=2, n=1, max_metric_calls=40, use_wandb=True,
                wandb_init_kwargs={"project": "dspy-pxn-test"}).compile(
        sim.seed_program(), trainset=splits.train, valset=splits.val[:6])
    (log,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    # wandb's service process may still be flushing the file when finish() returns (seen on wandb 0.31).
    deadline = time.monotonic() + 60
    while not (b"total_metric_calls" in (logged := log.read_bytes()) and b"best_score_on_valset" in logged):
        assert time.monotonic() < deadline, f"wandb wrote only {len(logged)} bytes: {logged[:80]!r}"
        time.sleep(0.2)


def test_use_wandb_without_wandb_names_the_install_and_an_alternative(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ImportError, match=r"pip install wandb.*use_mlflow=True"):
        BatchedGEPA(metric=sim.metric, reflection_lm=sim.SimulatedLM(), max_metric_calls=30, use_wandb=True)


def test_errors_dspy_gepa_raises_as_assertions_are_still_assertion_errors(splits):
    optimizer = BatchedGEPA(metric=sim.metric, reflection_lm=sim.SimulatedLM(), max_metric_calls=30)
    with pytest.raises(AssertionError, match="trainset"):
        optimizer.compile(sim.seed_program(), trainset=[])
    with pytest.raises(AssertionError, match="track_stats"):
        BatchedGEPA(metric=sim.metric, reflection_lm=sim.SimulatedLM(), max_metric_calls=30,
                    track_stats=False, track_best_outputs=True)


# ----------------------------------------------------------------------------- budget
def test_a_budget_too_small_for_one_step_runs_as_under_dspy_gepa_never_over_it(splits, caplog):
    """dspy.GEPA runs such a budget (overspending it); here the seed is validated and returned, within budget."""
    val = splits.val[:6]  # seed validation 6 + one proposal: 2x1 screening (at least) + 6 validation = 14
    lm = sim.SimulatedLM()
    with dspy.context(lm=lm), caplog.at_level(logging.WARNING, logger="dspy_pxn"):
        seed_only = BatchedGEPA(metric=sim.metric, max_metric_calls=13).compile(
            sim.seed_program(), trainset=splits.train, valset=val)
    assert "The smallest budget that buys one step is 14" in caplog.text
    assert "parent and child on 1 training example(s)" in caplog.text
    assert seed_only.detailed_results.total_metric_calls == 6 and len(seed_only.detailed_results.candidates) == 1
    assert lm.stats()["calls"]["task"] == 6  # the seed's validation, nothing over budget
    caplog.clear()
    with dspy.context(lm=lm), caplog.at_level(logging.WARNING, logger="dspy_pxn"):  # a minibatch of one's own: 3
        BatchedGEPA(metric=sim.metric, max_metric_calls=17, reflection_minibatch_size=3).compile(
            sim.seed_program(), trainset=splits.train, valset=val)
    assert "The smallest budget that buys one step is 18" in caplog.text
    assert "parent and child on 3 training example(s)" in caplog.text
    with dspy.context(lm=lm):
        best = BatchedGEPA(metric=sim.metric, max_metric_calls=18, p=1, n=1).compile(
            sim.seed_program(), trainset=splits.train, valset=val)
    assert len(best.detailed_results.steps) == 1
    assert best.detailed_results.total_metric_calls <= 18


def test_a_budget_that_cannot_pay_for_one_full_proposal_buys_one_on_fewer_rows(splits):
    """dspy.GEPA overspends such a budget to take its step; here, with the minibatch left to the optimizer, the
    first proposal is screened on the rows the budget can pay for beside its validation, never over budget. Once a
    proposal was made the run stops where the next full one no longer fits, and a minibatch the user gave is never
    shrunk."""
    val = splits.val[:6]
    minibatches: list[list[int]] = []

    class Heard:
        def on_minibatch_sampled(self, event):  # gepa's step loop
            minibatches.append(list(event["minibatch_ids"]))

        def on_proposal_decided(self, event):  # the async schedule's own event
            minibatches.append(list(event["minibatch_ids"]))

    for budget, schedule in itertools.product((14, 15, 16, 17), ("steps", "async")):
        # The seed's 6 and a validation's 6 leave 2, 3, 4, 5: one proposal on 1, 1, 2, 2 rows.
        minibatches.clear()
        lm = sim.SimulatedLM()
        with dspy.context(lm=lm):
            result = BatchedGEPA(metric=sim.metric, max_metric_calls=budget, p=1, n=1, schedule=schedule,
                                 gepa_kwargs={"callbacks": [Heard()]}).compile(
                sim.seed_program(), trainset=splits.train, valset=val).detailed_results
        rows = (budget - 12) // 2
        assert [len(ids) for ids in minibatches] == [rows], (budget, minibatches)
        assert lm.stats()["calls"]["task"] == result.total_metric_calls <= budget
        assert lm.stats()["calls"]["reflection"] == 1
    minibatches.clear()
    with dspy.context(lm=sim.SimulatedLM()):
        BatchedGEPA(metric=sim.metric, max_metric_calls=17, p=1, n=1, reflection_minibatch_size=3,
                    gepa_kwargs={"callbacks": [Heard()]}).compile(sim.seed_program(), trainset=splits.train, valset=val)
    assert minibatches == []  # 2x3 + 6 does not fit in the 11 left: the seed is returned
    for schedule in ("steps", "async"):  # 6 for the seed, then 23: one full proposal (12 with its validation) and 11
        minibatches.clear()
        lm = sim.SimulatedLM()
        with dspy.context(lm=lm):
            result = BatchedGEPA(metric=sim.metric, max_metric_calls=29, p=1, n=1, schedule=schedule,
                                 gepa_kwargs={"callbacks": [Heard()]}).compile(
                sim.seed_program(), trainset=splits.train, valset=val).detailed_results
        assert minibatches and {len(ids) for ids in minibatches} == {3}, (schedule, minibatches)
        assert lm.stats()["calls"]["task"] == result.total_metric_calls <= 29


def test_a_budget_below_the_seeds_validation_returns_the_program_unchanged_without_an_lm_call(splits, caplog):
    lm = sim.SimulatedLM()
    program = sim.seed_program()
    with dspy.context(lm=lm), caplog.at_level(logging.WARNING, logger="dspy_pxn"):
        returned = BatchedGEPA(metric=sim.metric, max_metric_calls=5).compile(
            program, trainset=splits.train, valset=splits.val[:6])
    assert "cannot pay for the seed's validation (6 calls" in caplog.text
    assert lm.stats()["calls"]["total"] == 0
    assert returned is not program and returned.predict.signature.instructions == program.predict.signature.instructions


# ----------------------------------------------------------------------------- the user's own line
class WithMetric(dspy.Module):
    """A ready-made program's shape: the program carries its feedback metric."""

    metric = staticmethod(sim.metric)

    def __init__(self):
        super().__init__()
        self.predict = sim.seed_program()

    def forward(self, question):
        return self.predict(question=question)


def test_the_design_cards_line_works(task_lm, splits, caplog):
    with caplog.at_level(logging.INFO, logger="dspy_pxn"):
        best = BatchedGEPA(p=2, n=1).compile(WithMetric(), trainset=splits.train, valset=splits.val[:6])
    results = best.detailed_results
    # auto="light": the metric calls dspy.GEPA's auto gives for one predictor and |val| = 6, spent to the last
    # step they pay for.
    light = dspy.GEPA(metric=sim.metric, auto="light", reflection_lm=sim.SimulatedLM()).auto_budget(
        num_preds=1, num_candidates=6, valset_size=6)
    assert results.budget == light
    assert light - 2 * 3 - 6 < results.total_metric_calls <= light and results.stopped_by == "auto"
    messages = [r.getMessage() for r in caplog.records]
    assert sum(f"No budget given: auto='light': {light} metric calls, as dspy.GEPA's auto gives" in m
               for m in messages) == 1
    assert sum("No reflection_lm given: the task LM" in m for m in messages) == 1


@pytest.mark.parametrize("level", ["light", "medium", "heavy"])
def test_auto_is_the_budget_dspy_gepa_gives_for_the_same_program_and_data(task_lm, splits, level):
    val = splits.val[:6]
    upstream = dspy.GEPA(metric=sim.metric, auto=level, reflection_lm=sim.SimulatedLM(), track_stats=True)
    upstream.compile(sim.seed_program(), trainset=splits.train, valset=val)  # sets its max_metric_calls from auto
    ours = BatchedGEPA(metric=sim.metric, auto=level).compile(sim.seed_program(), trainset=splits.train, valset=val)
    assert ours.detailed_results.budget == upstream.max_metric_calls
    assert ours.detailed_results.total_metric_calls <= upstream.max_metric_calls


def test_no_metric_anywhere_is_the_clear_error(task_lm, splits):
    with pytest.raises(TypeError, match=r"No metric: pass BatchedGEPA\(metric=...\).*\.metric attribute"):
        BatchedGEPA(max_metric_calls=30).compile(sim.seed_program(), trainset=splits.train, valset=splits.val[:6])


def test_a_plain_dspy_metric_is_accepted_with_one_info_line(task_lm, splits, caplog):
    def plain(gold, pred, trace=None):
        return sim.score(gold, pred)

    with caplog.at_level(logging.INFO, logger="dspy_pxn"):
        best = BatchedGEPA(metric=plain, p=2, n=1, max_metric_calls=60).compile(
            sim.seed_program(), trainset=splits.train, valset=splits.val[:6])
    assert sum("returns a score only" in r.getMessage() for r in caplog.records) == 1
    assert len(best.detailed_results.steps) >= 1


def test_a_metric_with_no_usable_score_on_the_seed_is_an_error_after_its_validation(splits):
    lm = sim.SimulatedLM()

    def words(gold, pred, trace=None, pred_name=None, pred_trace=None):
        return "correct"

    with dspy.context(lm=lm):
        with pytest.raises(ValueError, match=r"metric words gave no usable score on any of the seed program's 6"):
            BatchedGEPA(metric=words, max_metric_calls=30).compile(sim.seed_program(), trainset=splits.train,
                                                                   valset=splits.val[:6])
    assert lm.stats()["calls"]["total"] == 6  # the seed's validation, and nothing after it


def _files_in(log_dir) -> set[str]:
    """What a run left in its log_dir: file and folder names at the top (the per-example output files inside
    gepa's folders are named by iteration, which the schedules number alike but not identically)."""
    return {entry.name for entry in log_dir.iterdir()}


@pytest.mark.parametrize("width", [{"p": 1, "n": 1}, {"p": 4, "n": 1}, {"p": 2, "n": 2, "schedule": "steps"}])
def test_log_dir_holds_what_dspy_gepa_writes_there_at_every_width(task_lm, splits, tmp_path, width):
    """gepa's engine writes its candidate tree as each candidate joins; the asynchronous schedule adds candidates
    itself, and writes it too."""
    runs = {}
    for name, optimizer, extra in (("dspy.GEPA", dspy.GEPA, {"track_stats": True}), ("ours", BatchedGEPA, width)):
        log_dir = tmp_path / name
        optimizer(metric=sim.metric, max_metric_calls=150, reflection_lm=sim.SimulatedLM(), num_threads=4,
                  log_dir=str(log_dir), **extra).compile(sim.seed_program(), trainset=splits.train, valset=splits.val)
        runs[name] = _files_in(log_dir)
    assert "candidate_tree.html" in runs["dspy.GEPA"]
    assert runs["dspy.GEPA"] <= runs["ours"], runs["dspy.GEPA"] - runs["ours"]
    assert (tmp_path / "ours" / "candidate_tree.html").read_text().count("<") > 10


def _gepa_metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
    return 1.0


# A value other than the default for each of dspy.GEPA's arguments (the budgets one at a time).
GIVEN = {
    "metric": _gepa_metric, "auto": "medium", "max_full_evals": 3, "max_metric_calls": 77,
    "reflection_minibatch_size": 5, "candidate_selection_strategy": "current_best", "reflection_lm": sim.SimulatedLM(),
    "skip_perfect_score": False, "add_format_failure_as_feedback": True,
    "instruction_proposer": lambda candidate, reflective_dataset, components_to_update: {},
    "code_proposer": lambda **kwargs: {}, "component_selector": "all", "use_merge": False, "max_merge_invocations": 7,
    "num_threads": 3, "failure_score": -1.0, "perfect_score": 2.0, "log_dir": "runs/attribute-test",
    "track_stats": False, "use_wandb": True, "wandb_api_key": "key", "wandb_init_kwargs": {"project": "p"},
    "track_best_outputs": False, "warn_on_score_mismatch": False, "use_mlflow": True, "seed": 7,
    "gepa_kwargs": {"display_progress_bar": True},
}
BUDGETS = ("auto", "max_full_evals", "max_metric_calls")


@pytest.mark.parametrize("name", [n for n in inspect.signature(dspy.GEPA.__init__).parameters if n != "self"])
def test_each_of_dspy_gepas_arguments_is_the_attribute_dspy_gepa_keeps_it_in(name):
    """``BatchedGEPA(x=v)`` keeps ``v`` where ``dspy.GEPA(x=v)`` does, for code written against dspy.GEPA's
    attributes: one value per argument, never a second copy that disagrees."""
    from dspy_pxn.teleprompter import DSPY_GEPA_ATTRIBUTES

    assert name in GIVEN, f"dspy.GEPA has an argument this test does not give: {name}"
    budget = {} if name in BUDGETS else {"max_metric_calls": 50}
    given = {"reflection_lm": sim.SimulatedLM(), **budget, name: GIVEN[name]}
    if name == "track_best_outputs":
        given[name] = True  # its default is False
    optimizer = BatchedGEPA(**given)
    assert getattr(optimizer, DSPY_GEPA_ATTRIBUTES.get(name, name)) == given[name]
