r"""The LiveBench-Math scorers: LiveBench's verdict, rule by rule, on both sides of each rule.

Each case states the verdict LiveBench's grader gives (livebench/process_results/math/ and
the dispatch in livebench/gen_ground_truth_judgment.py) and the rule that decides it. The
verdicts were reasoned from those rules; benchmarks/bench_livebench_parity.py checks the
same on thousands of answers against LiveBench's own functions.
"""

import itertools
from concurrent.futures import ThreadPoolExecutor

import dspy
import pytest
from dspy.utils import DummyLM
from dspy_pxn.programs.data import livebench_math_rows
from dspy_pxn.programs.math_scoring import (
    EquivalenceJudge,
    ExpressionOrdering,
    MultipleChoice,
    SymbolicEquivalence,
    ThreeDigitInteger,
    Unscorable,
    boxed_content,
    choice_value,
    edit_distance,
    read_expression_ids,
    scorer_for,
    visible_response,
)

from tests.test_programs_helpers import require_data

COT = (
    "Let me work through this step by step.\nFirst, 3 + 4 = 7 and 12 / 4 = 3, so the two cases agree.\n"
    "Checking the boundary case separately gives the same result.\n\n"
)
PROSE = "\n\nI hope this helps! Let me know if you would like me to go through any of the steps in more detail."


@pytest.fixture(scope="module")
def rows():
    return livebench_math_rows(require_data("livebench_math"))


def of(rows, *prefixes):
    return [r for r in rows if r["subtask"].startswith(prefixes)]


# --------------------------------------------------------------------------- #
# Dispatch and shared reading rules
# --------------------------------------------------------------------------- #


def test_every_subtask_has_a_scorer_of_the_right_kind(rows):
    kinds = {r["subtask"]: type(scorer_for(r["subtask"])) for r in rows}
    assert len(kinds) == 19
    assert {kinds[s] for s in kinds if s.startswith(("amc", "updated_amc", "smc"))} == {MultipleChoice}
    assert {kinds[s] for s in kinds if s.startswith("aime")} == {ThreeDigitInteger}
    assert {kinds[s] for s in kinds if s in ("usamo", "imo")} == {ExpressionOrdering}
    assert {kinds[s] for s in kinds if s.startswith("amps_hard")} == {SymbolicEquivalence}
    with pytest.raises(ValueError, match="no scorer for LiveBench-Math subtask 'zebra_puzzle'"):
        scorer_for("zebra_puzzle")


def test_dispatch_follows_livebench_words():
    # LiveBench splits the subtask on "_": second word "amc" is multiple choice too.
    assert isinstance(scorer_for("updated_amc_12a_2023"), MultipleChoice)
    assert isinstance(scorer_for("smc"), MultipleChoice)
    assert isinstance(scorer_for("aime_ii_2024"), ThreeDigitInteger)
    with pytest.raises(ValueError):
        scorer_for("olympiad")  # the task name, not a subtask: LiveBench dispatches on imo/usamo


def test_think_blocks_are_removed_before_reading():
    assert visible_response("<think>AAAAA\nmore</think>CCCCC<think>x</think>") == "CCCCC"
    assert visible_response(None) == ""


@pytest.mark.parametrize(("text", "content", "why"), [
    (r"\boxed{1} then \boxed{\frac{a}{b}} end", r"\frac{a}{b}", "the last box, braces balanced"),
    (r"$\boxed{x$+1}$", "x+1", "dollars inside the box are dropped"),
    (r"\boxed 5$ and \boxed{7}", "5", r"a '\boxed ' with a space anywhere wins, up to the next $"),
    (r"\fbox{C}", "C", r"\fbox counts when there is no \boxed"),
    (r"\boxed{open", None, "a box that never closes is no box"),
    ("no box", None, "nothing to read"),
])
def test_boxed_content_reads_like_livebench(text, content, why):
    assert boxed_content(text) == content, why


def test_a_boxed_not_followed_by_a_brace_makes_livebench_fail():
    with pytest.raises(Unscorable):
        boxed_content(r"\boxed\text{C}")


# --------------------------------------------------------------------------- #
# AMC / SMC
# --------------------------------------------------------------------------- #

SMC_QUESTION = (r"What is the value of $\sqrt{\frac{2023}{2+0+2+3}}$? $\textbf{(A) }13\qquad\textbf{(B) }15\qquad"
                r"\textbf{(C) }17\qquad\textbf{(D) }19\qquad\textbf{(E) }21$ If you cannot determine the correct "
                "multiple-choice answer, take your best guess. Once you have your answer, please duplicate that "
                "letter five times in a single string. For example, if the answer is F, then write FFFFF.")


@pytest.mark.parametrize(("answer", "score", "why"), [
    ("CCCCC", 1, "the letter four (or more) times in a row"),
    (COT + "CCCC", 1, "four in a row is enough"),
    (COT + "CCC", 0, "three in a row is not, and no other rule finds C"),
    (COT + "ccccc", 0, "the run is case-sensitive; the last line 'ccccc' is not the letter alone"),
    (COT + "CCCCC\nWait, no: AAAAA", 1, "a run of the gold letter anywhere counts, even before a changed mind"),
    (COT + "AAAAA", 0, "another letter's run is no rule of LiveBench's"),
    (COT + r"The answer is $\boxed{C}$.", 1, "the last box holds the letter"),
    (COT + r"$\boxed{\text{C}}$", 1, r"\text{} is unwrapped inside the box"),
    (COT + r"\boxed C", 1, r"'\boxed ' with a space"),
    (COT + r"\fbox{C}", 1, r"\fbox is read as a box"),
    (COT + r"$\boxed{C}$ no, $\boxed{A}$", 0, "only the last box is read"),
    (COT + r"\boxed\text{C}", 0, "LiveBench's box reader fails on this and records 0"),
    (COT + "The answer is 17.", 1, "the value of choice C (17) is among the last 22 characters"),
    (COT + "The answer is 117.", 1, "the value only has to occur in the window, even inside 117"),
    (COT + "So the answer is 17." + PROSE, 0, "the value is further from the end than 22 characters"),
    (COT + "The answer is 19.", 0, "the value of another choice"),
    (COT + "C", 1, "the last line is the letter"),
    (COT + "**C**", 1, "the last line is the letter, asterisks ignored"),
    (COT + "Final answer: C", 0, "the last line is not the letter alone and has no parentheses"),
    (COT + "Final answer: (C)", 1, "the first parentheses of the last line hold the letter"),
    (COT + "Not (A); it is (C)", 0, "only the first parentheses of the last line are read"),
    ("<solution>C</solution>", 1, "a <solution> tag holding the letter"),
    ("<solution>CA</solution>", 0, "a <solution> tag must hold one repeated character"),
    ("<think>CCCCC</think>" + COT + "AAAAA", 0, "think blocks are removed first"),
    ("<think>AAAAA</think>" + COT + "CCCCC", 1, "think blocks are removed first"),
    ("", 0, "nothing to read"),
])
def test_multiple_choice_verdicts(answer, score, why):
    assert MultipleChoice().grade("C", answer, SMC_QUESTION).score == score, why


def test_multiple_choice_hints_keep_the_five_letter_format_out_of_the_score():
    scorer = MultipleChoice()
    plain = scorer.grade("C", COT + "CCCCC", SMC_QUESTION)
    assert plain.score == 1 and plain.hints == () and plain.strict_score == 1
    by_value = scorer.grade("C", COT + "The answer is 17.", SMC_QUESTION)
    assert by_value.score == 1 and by_value.strict_score == 0
    assert "five times in a row at the end: CCCCC" in by_value.hints[0] and "(17)" in by_value.reason
    changed = scorer.grade("C", "CCCCC\nWait, no: AAAAA", SMC_QUESTION)
    assert changed.score == 1 and "the last letter run is AAAAA" in changed.hints[0]
    wrong = scorer.grade("C", "AAAAA", SMC_QUESTION)
    assert wrong.problems == ("chose A, the correct choice is C",) and wrong.got == "AAAAA"


def test_multiple_choice_rejects_a_reference_that_is_not_a_letter():
    with pytest.raises(ValueError, match="one letter A-E"):
        MultipleChoice().grade("17", "17")


def test_choice_values_come_from_the_question(rows):
    questions = of(rows, "amc_", "updated_amc_", "smc")
    assert len(questions) == 117
    unread = 0
    for r in questions:
        gold, scorer = r["ground_truth"], scorer_for(r["subtask"])
        value = choice_value(r["turns"][0], gold)
        # LiveBench stands in the word FAILURE for a choice it cannot read (two released questions).
        unread += value == "FAILURE"
        assert scorer.grade(gold, COT + f"The answer is {value}.", r["turns"][0]).score == 1
        assert scorer.grade(gold, COT + gold * 5, r["turns"][0]).score == 1
        assert scorer.grade(gold, COT + ("B" if gold != "B" else "D") * 5, r["turns"][0]).score == 0
    assert unread == 2


# --------------------------------------------------------------------------- #
# AIME
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(("answer", "score", "why"), [
    (COT + "The answer is 025", 1, "the three digits are in the last 50 characters"),
    (COT + r"$\boxed{025}$", 1, "boxing changes nothing"),
    (COT + "**025**", 1, "nor does bold"),
    (COT + "The answer is 025. Done.", 1, "short trailing prose keeps them in the window"),
    (COT + "The answer is 025." + PROSE, 0, "long trailing prose pushes them out of the window"),
    (COT + "The answer is 25", 0, "'25' does not contain '025'"),
    (COT + "The answer is 1025", 1, "the digits may sit inside a longer number"),
    (COT + "I first got 025, but it is 026.", 1, "a changed mind still leaves 025 in the window"),
    (COT + "The answer is 026", 0, "a near miss"),
    ("<think>It is 025.</think>" + COT + "The answer is 026", 0, "think blocks are removed first"),
    ("", 0, "nothing to read"),
])
def test_aime_verdicts(answer, score, why):
    assert ThreeDigitInteger().grade("025", answer).score == score, why


def test_aime_hints_and_problems():
    scorer = ThreeDigitInteger()
    changed = scorer.grade("025", "I first got 025, but it is 026.")
    assert changed.score == 1 and changed.strict_score == 0 and "ends with 026" in changed.hints[0]
    assert scorer.grade("025", "The answer is 025").hints == ()
    assert "three digits" in scorer.grade("025", "The answer is 25").problems[0]
    assert "not at the end" in scorer.grade("025", "The answer is 025." + PROSE).problems[0]


def test_aime_real_questions(rows):
    questions = of(rows, "aime_")
    assert len(questions) == 29
    for r in questions:
        gold, scorer = r["ground_truth"], scorer_for(r["subtask"])
        assert scorer.grade(gold, COT + f"So the answer is **{gold}**.").score == 1
        assert scorer.grade(gold, COT + f"So the answer is {(int(gold) + 1) % 1000:03d}.").score == 0


# --------------------------------------------------------------------------- #
# Olympiad
# --------------------------------------------------------------------------- #

GOLD7 = "1,6,7,2,3,4,5"


@pytest.mark.parametrize(("answer", "score", "why"), [
    ("Answer: 1, 6, 7, 2, 3, 4, 5\nNote: expression 99 was not needed.", 1,
     "regression: only the last 'Answer:' line is read, not later lines"),
    (COT + "**Answer:** 1, 6, 7, 2, 3, 4, 5", 1, "bold markers are dropped"),
    (COT + "Final Answer: 1, 6, 7, 2, 3, 4, 5.", 1, "any 'answer:' label; periods dropped"),
    (COT + "Answer:\n1, 6, 7, 2, 3, 4, 5", 1, "an empty 'Answer:' line is followed by the next line"),
    (COT + "Answer: <1>, <6>, <7>, <2>, <3>, <4>, <5>", 1, "angle brackets dropped"),
    (COT + "Answer: expression 1, expression 6, expression 7, expression 2, expression 3, expression 4, "
     "expression 5", 1, "each item's last word is read"),
    (COT + r"Answer: $\boxed{1, 6, 7, 2, 3, 4, 5}$", 1, "dollars, braces and 'boxed' are dropped"),
    (COT + "Answer: 6, 1, 7, 2, 3, 4, 5", 5 / 7, "two substitutions over 7"),
    (COT + "Answer: 1, 6, 7", 3 / 7, "four deletions over 7"),
    (COT + "Answer: 1, 6, 7, 2, 3, 4, 5, 8, 9", 7 / 9, "regression: two insertions over the longer list, 9"),
    (COT + "Answer: 1 6 7 2 3 4 5", 1 / 7, "without commas the item's last word, 5, is all that is read"),
    (COT + "Answer: 1, 6, 7, 2, 3, 4, 5, ²", 7 / 8, "an unreadable item still costs one edit"),
    (COT + "Answer: 6, 1, 7, 2, 3, 4, 5\nOn reflection:\nAnswer: 1, 6, 7, 2, 3, 4, 5", 1, "the last label wins"),
    (COT + "Answer: 1, 6, 7, 2, 3, 4, 5\nOn reflection:\nAnswer: 6, 1, 7, 2, 3, 4, 5", 5 / 7, "the last label wins"),
    (COT + r"$\boxed{1, 6, 7, 2, 3, 4, 5}$" + PROSE, 1, "without a label, the last box"),
    (COT + "The order is 1, 6, 7, 2, 3, 4, 5.", 1, "without label or box, the last line's digit runs"),
    ("<think>Answer: 1, 6, 7, 2, 3, 4, 5</think>Answer: 6, 1, 7, 2, 3, 4, 5", 5 / 7, "think blocks removed"),
    ("", 0, "nothing to read"),
])
def test_olympiad_verdicts(answer, score, why):
    assert ExpressionOrdering().grade(GOLD7, answer).score == pytest.approx(score), why


@pytest.mark.parametrize(("answer", "why"), [
    (r"The expression is $\boxed{1}$", "regression: a boxed single identifier"),
    (COT + "1", "regression: a bare identifier on the last line"),
    (COT + "Answer: 1", "the label"),
])
def test_olympiad_single_identifier_answers(answer, why):
    assert ExpressionOrdering().grade("1", answer).score == 1, why


def test_olympiad_reading_order_and_hints():
    assert read_expression_ids("Answer: 2, 1, 3") == ([2, 1, 3], "the last 'Answer:' line")
    assert read_expression_ids(r"so $\boxed{2,1}$") == ([2, 1], "the last box")
    assert read_expression_ids("so 5, 6, 7") == ([5, 6, 7], "the last line")
    labelled = ExpressionOrdering().grade(GOLD7, "Answer: 1, 6, 7, 2, 3, 4, 5")
    assert labelled.hints == () and labelled.strict_score == 1
    bare = ExpressionOrdering().grade(GOLD7, "1, 6, 7, 2, 3, 4, 5")
    assert bare.score == 1 and bare.strict_score == 0 and "write it after 'Answer:'" in bare.hints[0]
    short = ExpressionOrdering().grade("1,2,3,4", "Answer: 1, 2")
    assert short.score == 0.5 and "gave 2 identifiers for 4 tags" in short.problems
    assert edit_distance([1, 2, 3], [2, 3]) == 1 and edit_distance([], [1, 2]) == 2 and edit_distance("ab", "ba") == 2


def test_olympiad_partial_credit_on_real_questions(rows):
    questions = of(rows, "usamo", "imo")
    assert len(questions) == 72
    for r in questions:
        gold = [int(n) for n in r["ground_truth"].split(",")]
        scorer = scorer_for(r["subtask"])
        assert "comma separated list" in r["turns"][0]
        assert scorer.grade(r["ground_truth"], COT + "Answer: " + ", ".join(map(str, gold))).score == 1.0
        padded = scorer.grade(r["ground_truth"], "Answer: " + ", ".join(map(str, gold + [99])))
        assert padded.score == pytest.approx(1 - 1 / (len(gold) + 1))  # over the longer list
        if len(gold) >= 4:
            swapped = gold[:]
            swapped[0], swapped[1] = swapped[1], swapped[0]
            result = scorer.grade(r["ground_truth"], "Answer: " + ",".join(map(str, swapped)))
            assert result.score == pytest.approx(1 - 2 / len(gold))
            assert f"<missing 1> is expression {gold[0]}, not {gold[1]}" in result.problems[0]


# --------------------------------------------------------------------------- #
# AMPS_Hard
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(("answer", "score", "judge_case", "why"), [
    (r"\boxed{13}", 1, False, "the box equals the reference"),
    (COT + "Final answer: 13", 1, False, "regression: no box and no $..$: the response ends with the reference"),
    (COT + "Final answer: 13.", 1, False, "a final period is ignored"),
    (COT + "Final answer: 13 (by Euclid)", 0, False, "no box, no $..$, and the response does not end with 13"),
    ("We use $a = 5$.\nFinal answer: 13", 0, True, "the last $..$ (5) is read, not the ending; 5 != 13"),
    (COT + "So $\\gcd = 13$.", 1, False, "the right side of the last $..$"),
    (COT + r"$\boxed{13.0004}$", 1, False, "a constant difference under 0.001 counts"),
    (COT + r"$\boxed{13.002}$", 0, True, "a difference of 0.002 does not; LiveBench asks its judge"),
    (COT + r"$\boxed{-13}$", 1, True, "negated: what LiveBench's judge is asked to accept"),
    (COT + r"$\boxed{14}$", 0, True, "not equal; LiveBench asks its judge"),
    (COT + r"$\boxed{13}$ no wait $\boxed{14}$", 0, True, "the last box is read"),
    (COT + r"$\boxed{14}$ no wait $\boxed{13}$", 1, False, "the last box is read"),
    (COT + r"$\boxed{x = 13}$", 1, False, "the right side of the last '='"),
    (COT + r"\boxed 13", 1, False, r"'\boxed ' with a space"),
    (COT + r"\boxed\text{13}", 0, False, "LiveBench's box reader fails and records 0"),
    (r"<think>\boxed{13}</think>\boxed{14}", 0, True, "think blocks are removed first"),
    ("", 0, False, "nothing to read"),
])
def test_amps_verdicts(answer, score, judge_case, why):
    result = SymbolicEquivalence().grade("13", answer)
    assert (result.score, result.judge_case) == (score, judge_case), why


@pytest.mark.parametrize(("subtask", "gold", "answer", "score", "judge_case", "why"), [
    ("amps_hard_derivatives", r"5 \sec ^2(5 x+1)-8 \sin (7-8 x)", r"\boxed{8\sin(8x-7)+5\sec^2(5x+1)}", 1, False,
     "an equivalent trigonometric form"),
    ("amps_hard_integral", r"\tan (5 x+1)", r"\boxed{\tan(5x+1) + C}", 1, False, "'+ C' is removed before reading"),
    ("amps_hard_integral", r"\tan (5 x+1)", r"\boxed{\tan(5x+1) + 7}", 0, True,
     "another constant: not equal, so LiveBench asks its judge"),
    ("amps_hard_complete_square", r"5 \left(x-\frac{4}{5}\right)^2-\frac{96}{5}",
     r"$5\left(x - \dfrac{4}{5}\right)^2 - \frac{96}{5}$", 1, False, r"\left, \right and \dfrac are normalised"),
    ("amps_hard_complete_square", r"5 \left(x-\frac{4}{5}\right)^2-\frac{96}{5}", r"\boxed{5x^2-8x-16}", 1, False,
     "the expanded polynomial is equal: LiveBench demands no form"),
    ("amps_hard_factor_polynomials", r"-3 (x-8) (x+2)", r"\boxed{-3x^2+18x+48}", 1, False, "equal in value"),
    ("amps_hard_characteristic_polynomial", r"\lambda ^2-5 \lambda -\frac{5}{7}",
     r"\boxed{-\lambda^2+5\lambda+\frac{5}{7}}", 1, True, "the other sign convention: its judge is asked to accept it"),
    ("amps_hard_characteristic_polynomial", r"\lambda ^2-5 \lambda -\frac{5}{7}",
     r"\boxed{\lambda^2-5\lambda-\frac{5}{7}+0.0001}", 1, False, "a constant difference under 0.001"),
    ("amps_hard_characteristic_polynomial", r"\lambda ^2-5 \lambda -\frac{5}{7}",
     r"\boxed{\lambda^2-5\lambda}", 0, True, "a different polynomial: LiveBench asks its judge"),
    ("amps_hard_geometric_mean", r"4 i \sqrt{5}", r"\boxed{\sqrt{-80}}", 1, False,
     "equal by value, i the imaginary unit (LiveBench's parser reads i as a variable and asks its judge)"),
])
def test_amps_equivalence(subtask, gold, answer, score, judge_case, why):
    result = scorer_for(subtask).grade(gold, answer)
    assert (result.score, result.judge_case) == (score, judge_case), why


def test_amps_hints_keep_the_requested_form_out_of_the_score():
    cases = [
        ("amps_hard_complete_square", r"5 \left(x-\frac{4}{5}\right)^2-\frac{96}{5}", r"\boxed{5x^2-8x-16}",
         "not written as a(x-h)^2+k"),
        ("amps_hard_factor_polynomials", r"-3 (x-8) (x+2)", r"\boxed{-3x^2+18x+48}", "product of linear factors"),
        ("amps_hard_gcd", "13", r"\boxed{-13}", "negative of this one"),
        ("amps_hard_gcd", "13", r"\boxed{13.0004}", "decimal approximation"),
        ("amps_hard_gcd", "13", "Final answer: 13", r"\boxed{...}"),
    ]
    for subtask, gold, answer, hint in cases:
        result = scorer_for(subtask).grade(gold, answer)
        assert result.score == 1 and result.strict_score == 0, (subtask, answer)
        assert any(hint in h for h in result.hints), (result.hints, hint)
    exact = scorer_for("amps_hard_factor_polynomials").grade(r"-3 (x-8) (x+2)", r"\boxed{-3(x+2)(x-8)}")
    assert exact.score == 1 and exact.hints == ()
    offset = scorer_for("amps_hard_integral").grade(r"\tan (5 x+1)", r"\boxed{\tan(5x+1) + 7}")
    assert "by a constant" in offset.problems[0]


def test_amps_every_ground_truth_is_equivalent_to_itself_boxed(rows):
    unreadable = []
    for r in of(rows, "amps_hard"):
        assert r"\boxed" in r["turns"][0]
        result = scorer_for(r["subtask"]).grade(r["ground_truth"], rf"So the result is $\boxed{{{r['ground_truth']}}}$.")
        if result.score != 1.0:
            unreadable.append((r["ground_truth"], result.judge_case, result.problems))
    # One released question's reference is Mathematica's "$Aborted": LiveBench leaves it to its judge.
    assert len(unreadable) == 1 and "Aborted" in unreadable[0][0] and unreadable[0][1]


def test_amps_negated_ground_truths_count_as_the_judge_is_asked(rows):
    for r in of(rows, "amps_hard"):
        if "Aborted" in r["ground_truth"] or r["ground_truth"].strip() == "0":
            continue
        result = scorer_for(r["subtask"]).grade(r["ground_truth"], rf"\boxed{{-\left({r['ground_truth']}\right)}}")
        assert (result.score, result.judge_case, result.strict_score) == (1, True, 0), r["ground_truth"]


def test_amps_other_questions_answers_are_not_equivalent(rows):
    by_subtask = {}
    for r in of(rows, "amps_hard"):
        by_subtask.setdefault(r["subtask"], []).append(r["ground_truth"])
    for subtask, golds in by_subtask.items():
        scorer = scorer_for(subtask)
        for gold, other in list(itertools.pairwise(golds))[:4]:
            if gold != other and "Aborted" not in gold + other:
                assert scorer.grade(gold, rf"\boxed{{{other}}}").score == 0.0, (subtask, gold, other)


def test_amps_scoring_is_thread_safe(rows):
    cases = [(r["subtask"], r["ground_truth"]) for r in of(rows, "amps_hard") if "Aborted" not in r["ground_truth"]][:24]

    def grade(case):
        subtask, gold = case
        return scorer_for(subtask).grade(gold, rf"\boxed{{{gold}}}").score

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert list(pool.map(grade, cases)) == [1.0] * len(cases)


# --------------------------------------------------------------------------- #
# The optional judge
# --------------------------------------------------------------------------- #


def test_no_judge_by_default_and_none_is_asked():
    lm = DummyLM([{"equivalent": "True"}])
    with dspy.context(lm=lm):
        result = scorer_for("amps_hard_gcd").grade("13", r"\boxed{14}")
    assert scorer_for("amps_hard_gcd").judge is None
    assert result.score == 0 and result.judge_case and lm.history == []


def test_the_judge_decides_what_the_check_by_value_rejects():
    lm = DummyLM([{"equivalent": "True"}, {"equivalent": "False"}])
    scorer = scorer_for("amps_hard_gcd", judge_lm=lm)
    assert isinstance(scorer.judge, EquivalenceJudge)
    accepted = scorer.grade("13", r"\boxed{14}")
    assert accepted.score == 1 and accepted.judge_case and accepted.reason == "accepted by the LLM judge"
    assert accepted.strict_score == 0  # strict mode wants equality by value
    assert len(lm.history) == 1
    prompt = lm.history[0]["messages"][-1]["content"]
    assert "13" in prompt and "14" in prompt
    assert scorer.grade("13", r"\boxed{15}").score == 0 and len(lm.history) == 2


def test_the_judge_is_not_asked_when_a_rule_decides():
    lm = DummyLM([{"equivalent": "False"}])
    scorer = scorer_for("amps_hard_gcd", judge_lm=lm)
    assert scorer.grade("13", r"\boxed{13}").score == 1  # equal by value
    assert scorer.grade("13", r"\boxed{-13}").score == 1  # negated: the judge's own question, answered by value
    assert scorer.grade("13", "Final answer: 12").score == 0  # nothing read: LiveBench never asks its judge
    assert isinstance(scorer_for("smc", judge_lm=lm), MultipleChoice)
    assert lm.history == []
