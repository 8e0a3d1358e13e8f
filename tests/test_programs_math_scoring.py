"""The per-subtask LiveBench-Math scorers, on the real questions and their ground truths."""

import itertools
from concurrent.futures import ThreadPoolExecutor

import pytest
import sympy
from dspy_pxn.programs.data import livebench_math_rows
from dspy_pxn.programs.math_scoring import (
    ExpressionOrdering,
    MultipleChoice,
    SymbolicEquivalence,
    ThreeDigitInteger,
    edit_distance,
    last_boxed,
    scorer_for,
)

from tests.test_programs_helpers import require_data


@pytest.fixture(scope="module")
def rows():
    return livebench_math_rows(require_data("livebench_math"))


def of(rows, *prefixes):
    return [r for r in rows if r["subtask"].startswith(prefixes)]


def test_every_subtask_has_a_scorer_of_the_right_kind(rows):
    kinds = {r["subtask"]: type(scorer_for(r["subtask"])) for r in rows}
    assert len(kinds) == 19
    assert {kinds[s] for s in kinds if s.startswith(("amc", "updated_amc", "smc"))} == {MultipleChoice}
    assert {kinds[s] for s in kinds if s.startswith("aime")} == {ThreeDigitInteger}
    assert {kinds[s] for s in kinds if s in ("usamo", "imo")} == {ExpressionOrdering}
    assert {kinds[s] for s in kinds if s.startswith("amps_hard")} == {SymbolicEquivalence}
    with pytest.raises(ValueError, match="no scorer for LiveBench-Math subtask 'zebra_puzzle'.*known subtask prefixes"):
        scorer_for("zebra_puzzle")


def test_multiple_choice_needs_the_letter_five_times(rows):
    questions = of(rows, "amc_", "updated_amc_", "smc")
    assert len(questions) == 117
    for r in questions:
        gold, scorer = r["ground_truth"], scorer_for(r["subtask"])
        assert "duplicate that letter five times" in r["turns"][0]  # the format the scorer enforces
        other = "A" if gold != "A" else "B"
        assert scorer.grade(gold, gold * 5).score == 1.0
        assert scorer.grade(gold, f"It is not {other * 5}; the answer is ({gold}), so {gold * 5}").score == 1.0
        assert scorer.grade(gold, f"{gold * 5} ... on reflection {other * 5}").score == 0.0  # the last run counts
        bare = scorer.grade(gold, gold)
        assert bare.score == 0.0 and bare.got is None and "5 times in a row" in bare.problems[0]


def test_aime_needs_the_three_digit_integer_last(rows):
    questions = of(rows, "aime_")
    assert len(questions) == 29
    padded = 0
    for r in questions:
        gold, scorer = r["ground_truth"], scorer_for(r["subtask"])
        assert len(gold) == 3 and "exactly 3 digits" in r["turns"][0]
        assert scorer.grade(gold, f"Step 1 gives 17, so the answer is {gold}").score == 1.0
        assert scorer.grade(gold, rf"$\boxed{{{gold}}}$.").score == 1.0
        assert scorer.grade(gold, f"{gold} is wrong; it is {(int(gold) + 1) % 1000:03d}").score == 0.0
        if gold.startswith("0"):
            padded += 1
            unpadded = scorer.grade(gold, str(int(gold)))
            assert unpadded.score == 0.0 and "three digits" in unpadded.problems[0]
    assert padded >= 3  # the leading-zero rule is exercised on real answers


def test_olympiad_partial_credit_is_one_minus_edit_distance_over_length(rows):
    questions = of(rows, "usamo", "imo")
    assert len(questions) == 72
    for r in questions:
        gold = [int(n) for n in r["ground_truth"].split(",")]
        scorer = scorer_for(r["subtask"])
        assert "comma separated list" in r["turns"][0]
        assert scorer.grade(r["ground_truth"], "Reasoning 3, 4.\nAnswer: " + ", ".join(map(str, gold))).score == 1.0
        if len(gold) >= 4:
            swapped = gold[:]
            swapped[0], swapped[1] = swapped[1], swapped[0]
            result = scorer.grade(r["ground_truth"], ",".join(map(str, swapped)))
            assert result.score == pytest.approx(1 - 2 / len(gold))
            assert f"<missing 1> is expression {gold[0]}, not {gold[1]}" in result.problems[0]
            assert f"<missing 2> is expression {gold[1]}, not {gold[0]}" in result.problems[0]
            assert "2 of" in result.problems[0]


def test_olympiad_reading_and_missing_positions():
    scorer = ExpressionOrdering()
    assert scorer.parse("I think 3 then 4.\nAnswer: 2, 1, 3") == [2, 1, 3]
    assert scorer.parse("so the order is 5, 6, 7 overall") == [5, 6, 7]
    assert scorer.parse("7") == [7]
    assert scorer.parse("no idea") is None
    short = scorer.grade("1,2,3,4", "1, 2")
    assert short.score == 0.5 and "gave 2 identifiers for 4 tags" in short.problems
    assert scorer.grade("1,2,3", "").score == 0.0
    assert edit_distance([1, 2, 3], [2, 3]) == 1 and edit_distance([], [1, 2]) == 2 and edit_distance("ab", "ba") == 2


def test_amps_every_ground_truth_is_equivalent_to_itself_boxed(rows):
    unscorable = []
    for r in of(rows, "amps_hard"):
        assert r"\boxed" in r["turns"][0]
        result = scorer_for(r["subtask"]).grade(r["ground_truth"], rf"So the result is $\boxed{{{r['ground_truth']}}}$.")
        if result.score != 1.0:
            unscorable.append((r["question_id"], result.problems))
    # One released question's reference answer is Mathematica's "$Aborted"; every other one must grade 1.
    assert len(unscorable) == 1 and "cannot be scored" in unscorable[0][1][0]


def test_amps_other_questions_answers_are_not_equivalent(rows):
    by_subtask = {}
    for r in of(rows, "amps_hard"):
        by_subtask.setdefault(r["subtask"], []).append(r["ground_truth"])
    for subtask, golds in by_subtask.items():
        scorer = scorer_for(subtask)
        for gold, other in list(itertools.pairwise(golds))[:4]:
            if gold != other and "Aborted" not in gold + other:
                assert scorer.grade(gold, rf"\boxed{{{other}}}").score == 0.0, (subtask, gold, other)


def _gold(rows, subtask, index=0):
    return [r["ground_truth"] for r in rows if r["subtask"] == subtask][index]


def test_amps_equivalence_accepts_other_forms_of_the_same_value(rows):
    std = _gold(rows, "amps_hard_std")  # \sqrt{\frac{1877}{10}}
    assert scorer_for("amps_hard_std").grade(std, r"\boxed{\frac{\sqrt{18770}}{10}}").score == 1.0
    mean = _gold(rows, "amps_hard_geometric_mean")  # 4 i \sqrt{5}: i is the imaginary unit
    assert scorer_for("amps_hard_geometric_mean").grade(mean, r"\boxed{\sqrt{-80}}").score == 1.0
    derivative = _gold(rows, "amps_hard_derivatives")  # 5 \sec^2(5x+1) - 8 \sin(7-8x)
    assert scorer_for("amps_hard_derivatives").grade(derivative, r"\boxed{8\sin(8x-7)+5\sec^2(5x+1)}").score == 1.0
    poly = _gold(rows, "amps_hard_characteristic_polynomial", 1)
    assert scorer_for("amps_hard_characteristic_polynomial").grade(poly, rf"p(\lambda) = {poly}").score == 1.0


def test_amps_integrals_are_graded_up_to_a_constant(rows):
    integral, scorer = _gold(rows, "amps_hard_integral"), scorer_for("amps_hard_integral")
    assert scorer.grade(integral, rf"\boxed{{{integral} + 7}}").score == 1.0
    assert scorer.grade(integral, rf"\boxed{{{integral} + C}}").score == 1.0
    assert scorer.grade(integral, rf"\boxed{{2\left({integral}\right)}}").score == 0.0


def test_amps_factoring_and_completing_the_square_demand_the_form(rows):
    from dspy_pxn.programs.math_scoring import _final_expression, _to_sympy

    factored, factor = _gold(rows, "amps_hard_factor_polynomials"), scorer_for("amps_hard_factor_polynomials")
    expanded = sympy.latex(sympy.expand(_to_sympy(_final_expression(factored))))
    assert factor.grade(factored, rf"\boxed{{{factored}}}").score == 1.0
    flat = factor.grade(factored, rf"\boxed{{{expanded}}}")
    assert flat.score == 0.0 and "product of linear factors" in flat.problems[0]
    square, complete = _gold(rows, "amps_hard_complete_square", 1), scorer_for("amps_hard_complete_square")
    assert square == r"5 \left(x-\frac{4}{5}\right)^2-\frac{96}{5}"
    assert complete.grade(square, r"$5\left(x - \frac45\right)^2 - \frac{96}{5}$").score == 1.0
    assert "a(x-h)^2+k" in complete.grade(square, r"\boxed{5x^2-8x-16}").problems[0]


def test_amps_rejects_decimals_foreign_variables_and_unparseable_answers(rows):
    std, scorer = _gold(rows, "amps_hard_std"), scorer_for("amps_hard_std")
    assert "exact answer" in scorer.grade(std, r"\boxed{13.7}").problems[0]
    poly = _gold(rows, "amps_hard_characteristic_polynomial")
    assert "variables" in scorer_for("amps_hard_characteristic_polynomial").grade(poly, r"\boxed{x^4+1}").problems[0]
    assert "not parseable" in scorer.grade(std, r"\boxed{\frac{}{}}").problems[0]
    assert scorer.grade(std, "").got is None


def test_last_boxed_balances_braces():
    assert last_boxed(r"\boxed{1} then \boxed{\frac{a}{b}} end") == r"\frac{a}{b}"
    assert last_boxed("no box") is None and last_boxed(r"\boxed{open") is None


def test_amps_scoring_is_thread_safe(rows):
    cases = [(r["subtask"], r["ground_truth"]) for r in of(rows, "amps_hard") if "Aborted" not in r["ground_truth"]][:24]

    def grade(case):
        subtask, gold = case
        return scorer_for(subtask).grade(gold, rf"\boxed{{{gold}}}").score

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert list(pool.map(grade, cases)) == [1.0] * len(cases)
