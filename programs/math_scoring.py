r"""LiveBench-Math verdicts on single answers, written for this project.

A score printed by this module is meant to be a LiveBench-Math score: each scorer applies
the extraction and equivalence rules of LiveBench's own grader (the LiveBench repository,
``livebench/process_results/math/`` and the per-task dispatch of
``livebench/gen_ground_truth_judgment.py``), leniencies included, so numbers can be set
beside LiveBench's leaderboard and papers that report LiveBench-Math. The rules are
re-implemented here from reading that code, not copied; each docstring says which rule it
is and why it matters to the verdict.

| subtask                                   | scorer                      | LiveBench counts an answer correct when                          |
|-------------------------------------------|-----------------------------|------------------------------------------------------------------|
| ``amc_*``, ``updated_amc_*``, ``smc``     | :class:`MultipleChoice`     | the letter four times anywhere, or a boxed letter, or the        |
|                                           |                             | choice's value near the end, or the letter alone on the last line |
| ``aime_*``                                | :class:`ThreeDigitInteger`  | the three digits appear in the last 50 characters                 |
| ``usamo``, ``imo``                        | :class:`ExpressionOrdering` | partial credit: 1 - edit distance / the longer list's length     |
| ``amps_hard_*``                           | :class:`SymbolicEquivalence`| the last ``\boxed{}`` (or last ``$...$``) equals the reference   |

Where LiveBench cannot decide by rule it asks an LLM judge: only for AMPS_Hard, when its
symbolic check does not prove a read answer equal to the reference. There this module
decides by the question LiveBench puts to its judge ("equivalent or negatives of each
other?"), checked by value; an optional ``judge_lm`` (a ``dspy.LM``) may be asked instead
for what that check rejects. :attr:`Grade.judge_case` marks those verdicts.

The questions' own format instructions (five letters, three digits, ``Answer:``, a box)
are stricter than LiveBench's grader. That strictness stays useful for an optimizer, so
each :class:`Grade` carries it as ``hints`` — feedback on answers LiveBench counts correct
— and :attr:`Grade.strict_score` is the score that also demands it (the explicit strict
mode). It never changes :attr:`Grade.score`.

Scorers are pure, deterministic (without a judge) and thread-safe: GEPA calls the metric
from many threads at once, so there are no signal-based timeouts (a length cap instead).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import sympy

__all__ = [
    "Grade",
    "Scorer",
    "Unscorable",
    "EquivalenceJudge",
    "MultipleChoice",
    "ThreeDigitInteger",
    "ExpressionOrdering",
    "SymbolicEquivalence",
    "scorer_for",
    "visible_response",
    "boxed_content",
    "edit_distance",
    "read_expression_ids",
]

# Longer answers are not parsed as LaTeX: sympy work grows with size and a metric must
# return promptly (no signal timeouts are possible in worker threads).
MAX_LATEX_CHARS = 1500


@dataclass(frozen=True)
class Grade:
    """A LiveBench verdict on one answer, with what the optimizer needs to improve it.

    ``score`` is LiveBench's score. ``reason`` says which of LiveBench's rules decided it;
    ``got`` is what was read (None when nothing was); ``problems`` say why the score is
    below 1; ``hints`` say how the answer misses the question's own format although
    LiveBench counts it. ``judge_case`` marks a verdict LiveBench leaves to its LLM judge:
    an AMPS_Hard answer that is read but not equal to the reference by value (LiveBench
    also asks its judge about some answers equal by value that its symbolic check cannot
    prove equal; those are counted correct here, as its judge would).
    """

    score: float
    expected: str
    got: str | None
    format_rule: str
    reason: str = ""
    problems: tuple[str, ...] = field(default=())
    hints: tuple[str, ...] = field(default=())
    judge_case: bool = False

    @property
    def correct(self) -> bool:
        return self.score >= 1.0

    @property
    def strict_score(self) -> float:
        """The score when the question's own answer format is demanded too: 0 whenever a hint applies."""
        return 0.0 if self.hints else self.score


class Scorer(Protocol):
    """Grades one answer to one question of a subtask (``question`` is the prompt; only AMC/SMC read it)."""

    format_rule: str

    def grade(self, expected: str, answer: str, question: str = "") -> Grade: ...


class Unscorable(ValueError):
    """LiveBench's grader raises on this answer; it records the error and a score of 0."""


# --------------------------------------------------------------------------- #
# Reading rules shared by the subtasks
# --------------------------------------------------------------------------- #

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def visible_response(answer: str | None) -> str:
    """The response LiveBench grades: every ``<think>...</think>`` block removed first, for every task."""
    return _THINK.sub("", answer or "")


def boxed_content(text: str) -> str | None:
    r"""What LiveBench reads as the last box, or None when it finds none.

    Its rules, which decide several verdicts: a ``\boxed `` followed by a space anywhere
    wins, and runs to the next ``$``; otherwise the last ``\boxed`` (else the last
    ``\fbox``) up to the brace that closes its first ``{``, with ``$`` removed. A box
    whose braces never close is no box; a ``\boxed`` that is not followed by ``{`` makes
    LiveBench's grader fail (:class:`Unscorable`).
    """
    if "\\boxed " in text:
        return text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
    if start < 0:
        return None
    end = _closing_brace(text, start)
    if end is None:
        return None
    box = text[start : end + 1].replace("$", "").replace("fbox", "boxed")
    if "\\boxed " in box:
        return box[len("\\boxed ") :]
    if not box.startswith("\\boxed{"):
        raise Unscorable(f"LiveBench cannot read the box {box[:40]!r} (\\boxed must be followed by {{)")
    return box[len("\\boxed{") : -1]


def _closing_brace(text: str, start: int) -> int | None:
    """Index of the first ``}`` after ``start`` that brings the brace count back to zero."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def _solution_tag_says(text: str, gold: str) -> bool:
    """LiveBench's first rule for AMC and AIME: the last ``<solution>..</solution>`` (one line) is one character repeated."""
    tags = re.findall(r"<solution>(.*?)</solution>", text)
    if not tags:
        return False
    chars = set(tags[-1])
    return len(chars) == 1 and next(iter(chars)).lower() == gold.lower()


# --------------------------------------------------------------------------- #
# AMC / SMC: multiple choice
# --------------------------------------------------------------------------- #

_CHOICE = re.compile(r"\\textbf\{\(([A-E])\)\s?\}(.*?)(?:\\qquad|\$)")
# LiveBench's stand-in when it cannot read a choice's value from the question (two
# released questions): it then looks for this word near the end of the answer.
_UNREAD_CHOICE = "FAILURE"


def choice_value(question: str, letter: str) -> str:
    r"""The text of choice ``letter`` as LiveBench reads it from ``\textbf{(C) }17\qquad`` in the question."""
    values = {key: value.strip() for key, value in _CHOICE.findall(question)}
    return (values.get(letter) or _UNREAD_CHOICE).strip().strip("$").strip("~")


class MultipleChoice:
    """LiveBench's AMC/SMC verdict: the first of five lenient rules that recognises the gold letter.

    In order: a ``<solution>`` tag of that letter; the letter four times in a row anywhere
    (so an answer that names two letters' runs counts if one is right); the last box holding
    the letter; the choice's value among the last ``20 + len(value)`` characters; the last
    line being the letter, or its first parentheses holding it. The question asks for the
    letter five times; that is kept as a hint, not in the score.
    """

    format_rule = "the answer letter written five times in a row at the end, e.g. CCCCC"
    _run = re.compile(r"([A-E])\1{4,}")

    def grade(self, expected: str, answer: str, question: str = "") -> Grade:
        gold = expected.strip()
        if len(gold) != 1 or gold not in "ABCDE":
            raise ValueError(f"an AMC/SMC reference answer is one letter A-E, got {expected!r}")
        text = visible_response(answer)
        runs = self._run.findall(text)
        got = runs[-1] * 5 if runs else None
        try:
            reason = self._accepting_rule(gold, text, question)
        except Unscorable as exc:
            return Grade(0.0, gold * 5, got, self.format_rule, "LiveBench's grader fails on this answer", (str(exc),))
        if reason is None:
            return Grade(0.0, gold * 5, got, self.format_rule, "no LiveBench rule finds the letter",
                         (f"chose {runs[-1]}, the correct choice is {gold}" if runs
                          else f"no answer letter found; the correct choice is {gold}",))
        return Grade(1.0, gold * 5, got, self.format_rule, reason, hints=self._hints(gold, runs))

    def _accepting_rule(self, gold: str, text: str, question: str) -> str | None:
        if _solution_tag_says(text, gold):
            return f"the last <solution> tag holds {gold}"
        if gold * 4 in text:
            return f"{gold * 4} appears in the answer"
        text = text.replace("\\\\fbox{", "\\\\boxed{")
        box = boxed_content(text)
        if box is not None and box.replace("\\text{", "").replace("}", "").replace("\\", "").lower() == gold.lower():
            return f"the last box holds {gold}"
        value = choice_value(question, gold)
        if value in text[-(20 + len(value)) :]:
            return f"the value of choice {gold} ({value}) is among the last {20 + len(value)} characters"
        last_line = text.strip().split("\n")[-1]
        if last_line.strip().replace("*", "").lower() == gold.lower():
            return f"the last line is {gold}"
        if "(" in last_line and ")" in last_line and last_line.split("(")[1].split(")")[0].lower() == gold.lower():
            return f"the last line has ({gold})"
        return None

    @staticmethod
    def _hints(gold: str, runs: list[str]) -> tuple[str, ...]:
        if not runs:
            return (f"write the final letter five times in a row at the end: {gold * 5}",)
        if runs[-1] != gold:
            return (f"the last letter run is {runs[-1] * 5}, not {gold * 5}: "
                    "write the final letter once, five times, at the end",)
        return ()


# --------------------------------------------------------------------------- #
# AIME: three digits near the end
# --------------------------------------------------------------------------- #


class ThreeDigitInteger:
    """LiveBench's AIME verdict: the three-digit reference appears in the last 50 characters.

    The digits may sit inside a longer number or be followed by prose; an unpadded ``25``
    is not ``025``. The question asks for the three digits as the last part of the
    response; that is kept as a hint.
    """

    format_rule = "an integer 000-999 written with exactly three digits (leading zeros) as the last part of the answer"
    window = 50
    _last_int = re.compile(r"(\d+)(?!.*\d)", re.DOTALL)

    def grade(self, expected: str, answer: str, question: str = "") -> Grade:
        gold = expected.strip()
        text = visible_response(answer)
        m = self._last_int.search(text)
        got = m.group(1) if m else None
        if _solution_tag_says(text, gold):
            return Grade(1.0, gold, got, self.format_rule, f"the last <solution> tag holds {gold}")
        if gold in text[-self.window :]:
            hints = () if got == gold else (
                f"the answer ends with {got if got else 'no number'}, not {gold}: end the response with the three digits",)
            return Grade(1.0, gold, got, self.format_rule, f"{gold} is among the last {self.window} characters",
                         hints=hints)
        return Grade(0.0, gold, got, self.format_rule, f"{gold} is not among the last {self.window} characters",
                     (self._why_not(gold, got, text),))

    def _why_not(self, gold: str, got: str | None, text: str) -> str:
        if got is not None and got != gold and got.isdigit() and int(got) == int(gold):
            return f"the value is right but must be written with three digits: {gold}"
        if gold in text:
            return f"{gold} appears, but not at the end: finish the response with it"
        return "no integer found in the answer" if got is None else f"{got} is not the answer"


# --------------------------------------------------------------------------- #
# Olympiad: an ordering of expression identifiers
# --------------------------------------------------------------------------- #


def edit_distance(a: Sequence[object], b: Sequence[object]) -> int:
    """Levenshtein distance between two sequences (insert, delete, substitute: cost 1 each)."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


Ids = list[int | None]  # None: an item LiveBench could not read as an integer (it still costs an edit)


def _as_int(token: str) -> int | None:
    """Python's int() reading, as LiveBench uses it: signs, spaces, underscores and Unicode digits pass."""
    try:
        return int(token)
    except ValueError:
        return None


def _readable(ids: Ids) -> Ids | None:
    return ids if any(i is not None for i in ids) else None


def _first_digit_run(chunk: str) -> tuple[str, int]:
    """The first run of digits in ``chunk`` and how many other characters it has (LiveBench trims ends so)."""
    start = 0
    while start < len(chunk) and not chunk[start].isdigit():
        start += 1
    end = start
    while end < len(chunk) and chunk[end].isdigit():
        end += 1
    return chunk[start:end], len(chunk) - (end - start)


def _ids_after_answer_label(text: str) -> Ids | None:
    """The list on the last line containing ``answer:`` (or on the next line if nothing follows it there).

    Only that line is read, so notes after it do not count. Each comma-separated item is
    its last space-separated word, stripped of ``$ { } \\ boxed < >``.
    """
    lower = text.lower()
    if "answer:" not in lower:
        return None
    lines = lower.strip().split("\n")
    at = max(i for i, line in enumerate(lines) if "answer:" in line)
    listed = lines[at].split("answer:")[1].replace("**", "").replace(".", "").strip()
    if listed == "" and at < len(lines) - 1:
        listed = lines[at + 1].replace("answer:", "").replace("**", "").replace(".", "").strip()
    ids: Ids = []
    for item in listed.split(","):
        word = item.strip().split(" ")[-1]
        for noise in ("$", "{", "}", "\\", "boxed", "<", ">"):
            word = word.replace(noise, "")
        ids.append(_as_int(word))
    return _readable(ids)


def _ids_in_last_box(text: str) -> Ids | None:
    r"""The comma-separated integers in the last ``\boxed{}`` (the whole text if the box does not close)."""
    if "\\boxed" not in text:
        return None
    box = boxed_content(text)
    inside = (text if box is None else box).replace("\\text{", "").replace("}", "").replace("\\", "")
    return _readable([_as_int(item.strip()) for item in inside.strip().split(",")])


def _ids_on_last_line(text: str) -> Ids | None:
    """The first digit run of each comma-separated item of the last line."""
    last_line = text.strip().lower().split("\n")[-1]
    ids: Ids = []
    for item in last_line.strip().split(","):
        digits, _ = _first_digit_run(item)
        if digits.strip():
            ids.append(_as_int(digits.strip()))
    return _readable(ids) if ids else None


def _ids_after_last_label(text: str) -> Ids:
    """Last resort: digit runs of the items after the last ``answer:`` (or of the whole text), until an item has extra text."""
    ids: Ids = []
    for k, item in enumerate(part.strip() for part in text.lower().split("answer:")[-1].split(",")):
        digits, extra = _first_digit_run(item)
        if digits not in ("", "₂"):
            value = _as_int(digits)
            if value is None:
                raise Unscorable(f"LiveBench's grader fails on the digits {digits!r}")
            ids.append(value)
        if k > 0 and extra > 0:
            break
    return ids


_READERS: tuple[tuple[str, Callable[[str], Ids | None]], ...] = (
    ("the last 'Answer:' line", _ids_after_answer_label),
    ("the last box", _ids_in_last_box),
    ("the last line", _ids_on_last_line),
)


def read_expression_ids(answer: str) -> tuple[Ids, str]:
    """The identifiers LiveBench reads from an answer, and where it read them.

    The first reader that finds any integer wins: the last ``Answer:`` line, the last box,
    the last line, then the items after the last ``answer:``.
    """
    text = visible_response(answer)
    for where, reader in _READERS:
        ids = reader(text)
        if ids is not None:
            return ids, where
    return _ids_after_last_label(text), "the items after the last 'answer:'"


class ExpressionOrdering:
    """LiveBench's olympiad verdict: ``1 - edit_distance(read, gold) / max(len(read), len(gold))``.

    Dividing by the longer list means padding an answer with extra identifiers costs as
    much as leaving some out. The question asks for ``Answer: <list>``; a list read from
    elsewhere still counts, with a hint.
    """

    format_rule = "'Answer: ' then a comma-separated list of expression identifiers, one per <missing k> tag in order"

    def grade(self, expected: str, answer: str, question: str = "") -> Grade:
        gold = [int(n) for n in expected.split(",")]
        expected_text = ", ".join(map(str, gold))
        try:
            ids, where = read_expression_ids(answer)
        except Unscorable as exc:
            return Grade(0.0, expected_text, None, self.format_rule, "LiveBench's grader fails on this answer",
                         (str(exc),))
        if not ids:
            return Grade(0.0, expected_text, None, self.format_rule, "no identifiers found",
                         ("no list of expression identifiers found",))
        longer = max(len(ids), len(gold))
        score = 1 - edit_distance(ids, gold) / longer
        got = ", ".join("?" if i is None else str(i) for i in ids)
        hints = () if where == _READERS[0][0] else (f"the list was read from {where}: write it after 'Answer:'",)
        reason = f"read from {where}; edit distance {edit_distance(ids, gold)} over {longer} identifiers"
        return Grade(score, expected_text, got, self.format_rule, reason, self._problems(ids, gold), hints)

    @staticmethod
    def _problems(ids: Ids, gold: list[int]) -> tuple[str, ...]:
        problems = []
        wrong = [k for k in range(len(gold)) if k >= len(ids) or ids[k] != gold[k]]
        if wrong:
            def said(k: int) -> str:
                return "missing" if k >= len(ids) else ("unreadable" if ids[k] is None else str(ids[k]))

            shown = "; ".join(f"<missing {k + 1}> is expression {gold[k]}, not {said(k)}" for k in wrong[:12])
            more = f" (and {len(wrong) - 12} more)" if len(wrong) > 12 else ""
            problems.append(f"{len(wrong)} of {len(gold)} positions wrong: {shown}{more}")
        if len(ids) != len(gold):
            problems.append(f"gave {len(ids)} identifiers for {len(gold)} tags")
        return tuple(problems)


# --------------------------------------------------------------------------- #
# AMPS_Hard: equivalence of LaTeX answers
# --------------------------------------------------------------------------- #

# LiveBench's clean-up of the response before reading it: a "+C" goes wherever it is,
# sizing commands and thin spaces go, lines are joined (so "the last line" is the whole
# response), \cdot becomes "*".
_RESPONSE_EDITS = (
    ("+C", ""), ("+ C", ""), ("+ c", ""), ("+c", ""), ("\\\\fbox{", "\\\\boxed{"), ("\\dfrac", "\\frac"),
    ("\\tfrac", "\\frac"), ("\\left", ""), ("\\right", ""), ("\\bigl", ""), ("\\bigr", ""), ("\\Bigl", ""),
    ("\\Bigr", ""), ("\\,", ""), ("\\;", ""), ("\n", ""), ("\\cdot", "*"),
)
_REFERENCE_EDITS = (("\\left", ""), ("\\right", ""), (" ^", "^"), ("\\ ", "*"))


def _edited(text: str, edits: Sequence[tuple[str, str]]) -> str:
    for old, new in edits:
        text = text.replace(old, new)
    return text


# The normalisation of a read answer LiveBench takes from Minerva (Lewkowycz et al. 2022):
# the right side of the last "=", text/bold/overline/box wrappers unwrapped, \fracab and
# \sqrta shorthands braced, "100,000" read as 100000.
_UNWRAP = (
    (re.compile(r"\\text\{(.*?)\}"), r"\1"),
    (re.compile(r"\\textbf\{(.*?)\}"), r"\1"),
    (re.compile(r"\\overline\{(.*?)\}"), r"\1"),
    (re.compile(r"\\boxed\{(.*)\}"), r"\1"),
    (re.compile(r"frac([^{])(.)"), r"frac{\1}{\2}"),
    (re.compile(r"sqrt([^{\[])"), r"sqrt{\1}"),
)


def _normalized(latex: str) -> str:
    latex = latex.split("=")[-1]
    for pattern, repl in _UNWRAP:
        latex = pattern.sub(repl, latex)
    latex = latex.replace("$", "")
    return latex.replace(",", "") if latex.replace(",", "").isdigit() else latex


def _last_math_span(text: str) -> str | None:
    """The last ``$...$`` (or ``$$...$$``) span, its right side if it has an ``=``, or its last ``\\quad or\\quad`` part."""
    if text.count("$") < 2:
        return None
    close = text.rfind("$")
    if text[close - 1] == "$":
        close -= 1
    maths = text[text.rfind("$", 0, close) + 1 : close]
    if "=" in maths:
        return maths.split("=")[-1].strip()
    if "\\quad \\text{or} \\quad" in maths:
        return maths.split("\\quad \\text{or} \\quad")[-1].strip()
    return maths


def read_amps_answer(text: str) -> tuple[str, str] | None:
    r"""The normalised LaTeX LiveBench compares, and where it came from: the last box, else the last ``$...$``.

    ``text`` is the response after LiveBench's clean-up. None when there is neither; then
    LiveBench only checks whether the response ends with the reference, character for character.
    """
    box = boxed_content(text)
    if box is not None:
        return _normalized(box), "box"
    span = _last_math_span(text)
    return None if span is None else (_normalized(span), "math")


def _to_sympy(latex: str) -> sympy.Expr:
    from latex2sympy2_extended import latex2sympy

    if len(latex) > MAX_LATEX_CHARS:
        raise ValueError(f"answer longer than {MAX_LATEX_CHARS} characters")
    # AMPS (Mathematica) writes \log for the natural logarithm; latex2sympy reads it as log10.
    latex = re.sub(r"\\log\b", r"\\ln", latex)
    try:
        expr = latex2sympy(latex)
    except Exception:  # noqa: BLE001 - LiveBench retries with doubled backslashes undone, so do we
        expr = latex2sympy(latex.replace("\\\\", "\\"))
    if not isinstance(expr, sympy.Expr):
        raise ValueError(f"not a single expression: {expr}")
    # AMPS uses i for the imaginary unit (e.g. geometric means of negative numbers).
    return expr.subs(sympy.Symbol("i"), sympy.I)


# Deterministic evaluation points, away from 0 and from the integers where
# trigonometric and logarithmic answers have special values.
_POINTS = (0.6180339, 1.3247179, 0.4142135, 2.2360679, 1.7320508, 0.8660254, 3.1415926)


def _value(expr: sympy.Expr, subs: dict[sympy.Symbol, float]) -> complex | None:
    try:
        value = complex(expr.evalf(30, subs=subs))
    except (TypeError, ValueError, ZeroDivisionError, OverflowError):
        return None
    return value if math.isfinite(value.real) and math.isfinite(value.imag) else None


def _value_pairs(gold: sympy.Expr, pred: sympy.Expr) -> list[tuple[complex, complex]]:
    """Both expressions evaluated at shared points of all their variables, where both are finite."""
    symbols = sorted(gold.free_symbols | pred.free_symbols, key=str)
    pairs = []
    for base in _POINTS:
        subs = {s: base + 0.1 * j for j, s in enumerate(symbols)}
        g, p = _value(gold, subs), _value(pred, subs)
        if g is not None and p is not None:
            pairs.append((g, p))
    return pairs


def _close(a: complex, b: complex) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


@dataclass(frozen=True)
class _Comparison:
    """How a read answer relates to the reference by value."""

    equal: bool = False  # what LiveBench's symbolic check proves (difference 0, or a constant under 0.001)
    negated: bool = False
    offset: complex | None = None  # the constant difference, when there is one
    failure: str = ""  # why no comparison was possible


def _compare(gold: sympy.Expr, pred: sympy.Expr) -> _Comparison:
    """Equal when the difference is zero, or a constant of absolute value under 0.001 (LiveBench's tolerance)."""
    pairs = _value_pairs(gold, pred)
    if len(pairs) < 3:
        return _Comparison(failure="the answer cannot be evaluated where the reference can")
    diffs = [g - p for g, p in pairs]
    constant = all(abs(d - diffs[0]) <= 1e-9 * max(1.0, abs(g), abs(p)) for d, (g, p) in zip(diffs, pairs))
    if all(_close(g, p) for g, p in pairs) or (constant and abs(diffs[0]) < 1e-3):
        return _Comparison(equal=True)
    negated = all(_close(g, -p) for g, p in pairs)
    varies = bool(gold.free_symbols | pred.free_symbols)  # a constant offset only means something for functions
    return _Comparison(negated=negated, offset=diffs[0] if constant and varies else None)


class EquivalenceJudge:
    """An optional LLM judge for the AMPS_Hard answers LiveBench leaves to its own judge.

    It is asked what LiveBench's judge is asked — are the two expressions equivalent or
    negatives of each other — in this project's own prompt, through ``judge_lm``.
    """

    def __init__(self, judge_lm: Any) -> None:
        import dspy

        class SameExpression(dspy.Signature):
            """Two LaTeX expressions: the reference answer to a math problem and a student's final answer. Decide whether they are mathematically equivalent, or negatives of each other. Ignore formatting differences."""

            reference: str = dspy.InputField()
            answer: str = dspy.InputField()
            equivalent: bool = dspy.OutputField(desc="true if equivalent or negatives of each other, else false")

        self.lm = judge_lm
        self._predict = dspy.Predict(SameExpression)
        self._context = dspy.context

    def __call__(self, reference: str, answer: str) -> bool:
        with self._context(lm=self.lm):
            return bool(self._predict(reference=reference, answer=answer).equivalent)


@dataclass(frozen=True)
class _Form:
    """A shape the question asks for beyond the value (e.g. factored), with the words to say so."""

    check: Callable[[sympy.Expr, sympy.Symbol], bool]
    requirement: str


def _degree_in(expr: sympy.Expr, x: sympy.Symbol) -> int | None:
    try:
        return sympy.Poly(sympy.expand(expr), x).degree()
    except sympy.PolynomialError:
        return None


def _is_factored(expr: sympy.Expr, x: sympy.Symbol) -> bool:
    """A product whose every factor in x is linear (or a power of a linear factor), with at least two."""
    linear = 0
    for factor in sympy.Mul.make_args(expr):
        if x not in factor.free_symbols:
            continue
        base, power = factor.as_base_exp()
        if _degree_in(base, x) != 1 or not (power.is_Integer and power > 0):
            return False
        linear += int(power)
    return linear >= 2


def _is_completed_square(expr: sympy.Expr, x: sympy.Symbol) -> bool:
    """x occurs only inside squares of linear expressions: a (x - h)^2 + k."""
    squares = expr.atoms(sympy.Pow)
    marked = expr
    for power in squares:
        if power.exp == 2 and _degree_in(power.base, x) == 1:
            marked = marked.xreplace({power: sympy.Dummy()})
    return bool(squares) and x not in marked.free_symbols and marked != expr


class SymbolicEquivalence:
    r"""LiveBench's AMPS_Hard verdict: the read answer equals the reference.

    The answer is read from the last box, else the last ``$...$`` of the response; with
    neither, LiveBench only checks that the response ends with the reference verbatim.
    A read answer counts when its difference from the reference is zero or a constant
    under 0.001 in absolute value (so close decimals count). Anything else LiveBench
    hands to its LLM judge, asking "equivalent or negatives of each other?": this scorer
    answers that question by value (so a negated answer counts, which matters for the
    sign convention of characteristic polynomials) and asks ``judge`` about the rest
    when one is given. The question's own form (a box, an exact value, the factored or
    completed-square form, the reference's sign) is kept as hints.
    """

    def __init__(self, *, form: _Form | None = None, judge: Callable[[str, str], bool] | None = None) -> None:
        self.form = form
        self.judge = judge
        rule = r"an exact LaTeX expression inside \boxed{...}"
        self.format_rule = rule + (f", {form.requirement}" if form else "")

    def with_judge(self, judge: Callable[[str, str], bool] | None) -> SymbolicEquivalence:
        return self if judge is None else SymbolicEquivalence(form=self.form, judge=judge)

    def grade(self, expected: str, answer: str, question: str = "") -> Grade:
        shown = rf"\boxed{{{expected.strip()}}}"
        reference = _edited(expected, _REFERENCE_EDITS)
        text = _edited(visible_response(answer), _RESPONSE_EDITS)
        try:
            read = read_amps_answer(text)
        except Unscorable as exc:
            return Grade(0.0, shown, None, self.format_rule, "LiveBench's grader fails on this answer", (str(exc),))
        if read is None:
            return self._grade_ending(reference, text, shown)
        latex, where = read
        hints = () if where == "box" else (r"put the final answer in \boxed{...}",)
        try:
            gold = _to_sympy(reference)
        except Exception:  # noqa: BLE001 - one released question's reference is Mathematica's "$Aborted"
            return self._judged(shown, latex, reference, hints, "the reference answer is not a mathematical expression")
        try:
            pred = _to_sympy(latex)
        except Exception as exc:  # noqa: BLE001 - any parse failure of model output is a judge case for LiveBench
            return self._judged(shown, latex, reference, hints, f"the answer is not parseable LaTeX ({exc})")
        comparison = _compare(gold, pred)
        if comparison.equal:
            return Grade(1.0, shown, latex, self.format_rule, "equal to the reference",
                         hints=hints + self._form_hints(gold, pred))
        if comparison.negated:
            return Grade(1.0, shown, latex, self.format_rule,
                         "the negative of the reference (LiveBench's judge is asked to accept negatives)",
                         hints=hints + ("the expected answer is the negative of this one (mind the sign convention)",),
                         judge_case=True)
        return self._judged(shown, latex, reference, hints, self._difference(comparison))

    def _grade_ending(self, reference: str, text: str, shown: str) -> Grade:
        """No box and no ``$...$``: LiveBench counts the answer only if it ends with the reference (a final '.' aside)."""
        ending = text[:-1] if text.endswith(".") else text
        if ending[-len(reference) :] == reference:
            return Grade(1.0, shown, reference, self.format_rule, "the response ends with the reference",
                         hints=(r"put the final answer in \boxed{...}",))
        return Grade(0.0, shown, None, self.format_rule, r"no \boxed{} or $...$ answer, and the response does not "
                     "end with the reference", (r"no final answer found (put it in \boxed{...})",))

    def _judged(self, shown: str, latex: str, reference: str, hints: tuple[str, ...], why: str) -> Grade:
        """A verdict LiveBench leaves to its LLM judge: 0 by value, unless the optional judge accepts it."""
        if self.judge is not None and self.judge(reference, latex):
            return Grade(1.0, shown, latex, self.format_rule, "accepted by the LLM judge",
                         hints=hints + (f"not equal to the reference by value ({why})",), judge_case=True)
        return Grade(0.0, shown, latex, self.format_rule, "not equal to the reference (LiveBench asks its judge)",
                     (why,), judge_case=True)

    @staticmethod
    def _difference(comparison: _Comparison) -> str:
        if comparison.failure:
            return comparison.failure
        if comparison.offset is not None:
            return (f"differs from the reference by a constant ({comparison.offset.real:.4g}); LiveBench's check "
                    "compares the expressions themselves")
        return "not equivalent to the expected answer"

    def _form_hints(self, gold: sympy.Expr, pred: sympy.Expr) -> tuple[str, ...]:
        hints = []
        if pred.atoms(sympy.Float) and not gold.atoms(sympy.Float):
            hints.append("gives a decimal approximation; the question asks for an exact answer")
        symbols = sorted(gold.free_symbols, key=str)
        if self.form is not None and symbols and not self.form.check(pred, symbols[0]):
            hints.append(f"equal in value but not {self.form.requirement}")
        return tuple(hints)


# --------------------------------------------------------------------------- #
# Dispatch
# --------------------------------------------------------------------------- #

_MULTIPLE_CHOICE = MultipleChoice()
_AIME = ThreeDigitInteger()
_OLYMPIAD = ExpressionOrdering()
_AMPS = SymbolicEquivalence()
_AMPS_FORMS = {
    "amps_hard_factor_polynomials": SymbolicEquivalence(form=_Form(_is_factored, "written as a product of linear factors")),
    "amps_hard_complete_square": SymbolicEquivalence(form=_Form(_is_completed_square, "written as a(x-h)^2+k")),
}


def _livebench_scorer(subtask: str) -> Scorer | None:
    """LiveBench's dispatch on the subtask's underscore-separated words."""
    words = subtask.split("_")
    if words[0] in ("amc", "smc") or (len(words) > 1 and words[1] == "amc"):
        return _MULTIPLE_CHOICE
    if words[0] == "aime":
        return _AIME
    if words[0] in ("imo", "usamo"):
        return _OLYMPIAD
    if "amps_hard" in subtask:
        return _AMPS_FORMS.get(subtask, _AMPS)
    return None


def scorer_for(subtask: str, *, judge_lm: Any = None) -> Scorer:
    """The scorer for a LiveBench-Math subtask (e.g. ``aime_i_2024``, ``amps_hard_gcd``, ``usamo``).

    ``judge_lm`` (a ``dspy.LM``, off by default) is asked about the AMPS_Hard answers
    LiveBench leaves to its LLM judge; other subtasks never need one.
    """
    scorer = _livebench_scorer(subtask)
    if scorer is None:
        raise ValueError(f"no scorer for LiveBench-Math subtask {subtask!r}; known subtasks: amc_*, *_amc_*, smc*, "
                         "aime_*, imo, usamo, *amps_hard*")
    if isinstance(scorer, SymbolicEquivalence) and judge_lm is not None:
        return scorer.with_judge(EquivalenceJudge(judge_lm))
    return scorer
