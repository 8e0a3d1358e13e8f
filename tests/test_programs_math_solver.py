"""The LiveBench-Math solver end to end with a deterministic in-process LM: forward, metric, feedback."""

import dspy
import pytest
from dspy.utils import DummyLM
from dspy_pxn.programs.data import load_livebench_math
from dspy_pxn.programs.math_solver import SEED_INSTRUCTION, MathSolver, make_metric, metric, score

from tests.test_programs_helpers import require_data


@pytest.fixture(scope="module")
def split():
    return load_livebench_math(require_data("livebench_math"))


def first(split, prefix):
    return next(e for part in split for e in part if e.subtask.startswith(prefix))


def run(example, answer):
    lm = DummyLM([{"reasoning": "Working through it.", "answer": answer}])
    with dspy.context(lm=lm):
        pred = MathSolver()(question=example.question)
    # The question text (with its own format rules) reached the LM.
    assert example.question[-200:] in lm.history[-1]["messages"][-1]["content"]
    return pred


def test_solver_has_one_optimizable_predictor_with_the_seed_instruction():
    program = MathSolver()
    assert [name for name, _ in program.named_predictors()] == ["solve.predict"]
    assert program.solve.predict.signature.instructions == SEED_INSTRUCTION
    assert MathSolver("Be careful.").solve.predict.signature.instructions == "Be careful."


def test_the_solvers_carry_their_metrics_for_batched_gepa():
    from dspy_pxn.programs import gsm8k

    assert MathSolver().metric is metric and MathSolver().deepcopy().metric is metric
    assert gsm8k.GSM8KSolver().metric is gsm8k.metric


def test_correct_multiple_choice_answer_scores_one(split):
    example = first(split, "amc_")
    pred = run(example, example.answer * 5)
    assert pred.answer == example.answer * 5
    result = metric(example, pred)
    assert result.score == 1.0 and result.feedback.startswith("Correct.")
    assert score(example, pred) == 1.0


def test_wrong_format_feedback_states_expected_answer_and_required_format(split):
    example = first(split, "aime_")
    pred = run(example, str(int(example.answer) + 1))
    result = metric(example, pred, None, "solve.predict", None)
    assert result.score == 0.0
    assert f"The expected answer is {example.answer}." in result.feedback
    assert "exactly three digits" in result.feedback


def test_olympiad_feedback_names_wrong_positions(split):
    example = first(split, "usamo")
    gold = example.answer.split(",")
    wrong = [gold[1], gold[0], *gold[2:]]
    result = metric(example, run(example, "Answer: " + ", ".join(wrong)))
    assert 0 < result.score < 1
    assert f"<missing 1> is expression {gold[0]}, not {gold[1]}" in result.feedback
    assert "Partially correct" in result.feedback


def test_amps_answer_graded_symbolically(split):
    example = first(split, "amps_hard_gcd")
    assert metric(example, run(example, rf"\boxed{{{example.answer}}}")).score == 1.0
    miss = metric(example, run(example, r"\boxed{0}"))
    assert miss.score == 0.0 and r"\boxed{" in miss.feedback and "Not equivalent to the expected answer" in miss.feedback


def test_metric_handles_a_missing_prediction_and_rejects_examples_without_subtask(split):
    example = first(split, "smc")
    assert metric(example, None).score == 0.0
    with pytest.raises(ValueError, match="no `subtask` field.*load_livebench_math"):
        metric(dspy.Example(question="q", answer="A").with_inputs("question"), dspy.Prediction(answer="A"))


def test_score_is_livebench_verdict_and_feedback_keeps_the_question_format(split):
    example = first(split, "amc_")
    # The last line "(C)"-style answer: LiveBench counts it, the question asked for five letters.
    result = metric(example, run(example, f"After checking every option, the answer is ({example.answer})."))
    assert result.score == 1.0
    assert result.feedback.startswith("Counted correct by LiveBench's rules")
    assert f"write the final letter five times in a row at the end: {example.answer * 5}" in result.feedback


def test_metric_reads_choice_values_from_the_question(split):
    from dspy_pxn.programs.math_scoring import choice_value

    example = next(e for part in split for e in part
                   if e.subtask.startswith(("amc_", "smc")) and choice_value(e.question, e.answer) != "FAILURE")
    value = choice_value(example.question, example.answer)
    assert metric(example, dspy.Prediction(answer=f"The answer is {value}.")).score == 1.0


def test_strict_mode_demands_the_question_format(split):
    strict = make_metric(strict=True)
    example = first(split, "aime_")
    late = dspy.Prediction(answer=f"I got {example.answer}; step 2 was the hardest.")  # ends with another number
    assert metric(example, late).score == 1.0  # the digits are in LiveBench's 50-character window
    result = strict(example, late)
    assert result.score == 0.0 and "strict mode" in result.feedback
    assert strict(example, dspy.Prediction(answer=f"The answer is {example.answer}")).score == 1.0


def test_metric_with_a_judge_asks_it_only_for_amps_answers_not_equal_by_value(split):
    example = first(split, "amps_hard_gcd")
    lm = DummyLM([{"equivalent": "True"}])
    judged = make_metric(judge_lm=lm)
    assert judged(example, dspy.Prediction(answer=rf"\boxed{{{example.answer}}}")).score == 1.0
    assert lm.history == []
    result = judged(example, dspy.Prediction(answer=r"\boxed{123456}"))
    assert result.score == 1.0 and "accepted by the LLM judge" in result.feedback and len(lm.history) == 1
    assert metric(example, dspy.Prediction(answer=r"\boxed{123456}")).score == 0.0  # off by default
