"""Per-subtask scorers for LiveBench-Math answers, written for this project.

Each LiveBench-Math question states its own answer format, and a reflective optimizer
can only learn that format if the scorer enforces it and says what was wrong. So each
scorer returns a :class:`Grade` — a score in [0, 1] plus what it read, what it expected
and the rule the question set — and the feedback metric turns that into text.

| subtask (prefix)                      | scorer                   | the question demands                      |
|---------------------------------------|--------------------------|-------------------------------------------|
| ``amc_*``, ``updated_amc_*``, ``smc`` | :class:`MultipleChoice`  | the letter written five times: ``CCCCC``   |
| ``aime_*``                            | :class:`ThreeDigitInteger` | three digits ending the answer: ``025`` |
| ``usamo``, ``imo``                    | :class:`ExpressionOrdering` | ``Answer: 1, 6, 7, ...`` (partial credit) |
| ``amps_hard_*``                       | :class:`SymbolicEquivalence` | exact LaTeX in ``\\boxed{}``           |

Scorers are pure, deterministic and thread-safe (GEPA calls the metric from many
threads at once): no signal-based timeouts, a length cap instead.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import sympy

__all__ = [
    "Grade",
    "Scorer",
    "MultipleChoice",
    "ThreeDigitInteger",
    "ExpressionOrdering",
    "SymbolicEquivalence",
    "scorer_for",
    "edit_distance",
    "last_boxed",
]

# Longer answers are not parsed as LaTeX: sympy work grows with size and a metric must
# return promptly (no signal timeouts are possible in worker threads).
MAX_LATEX_CHARS = 1500


@dataclass(frozen=True)
class Grade:
    """A scorer's verdict on one answer.

    ``got`` is what the scorer read from the answer (None when it found nothing in the
    demanded format); ``problems`` lists what was wrong, most useful first.
    """

    score: float
    expected: str
    got: str | None
    format_rule: str
    problems: tuple[str, ...] = field(default=())

    @property
    def correct(self) -> bool:
        return self.score >= 1.0


class Scorer(Protocol):
    """Grades one answer against the ground truth of one subtask's question."""

    format_rule: str

    def grade(self, expected: str, answer: str) -> Grade: ...


# --------------------------------------------------------------------------- #
# AMC / SMC: a letter, repeated
# --------------------------------------------------------------------------- #


class MultipleChoice:
    """The chosen letter written ``repeat`` times in a row (the questions ask for five).

    The last such run in the answer counts, so reasoning that mentions other options
    before the final answer does no harm; a bare ``C`` does not meet the format.
    """

    def __init__(self, repeat: int = 5, letters: str = "ABCDE") -> None:
        self.repeat = repeat
        self.letters = letters
        self._run = re.compile(rf"([{letters}])\1{{{repeat - 1},}}")
        self.format_rule = f"the answer letter written {repeat} times in a row, e.g. {'C' * repeat}"

    def grade(self, expected: str, answer: str) -> Grade:
        gold = expected.strip().upper()[:1]
        runs = self._run.findall(answer or "")
        if not runs:
            return Grade(0.0, gold * self.repeat, None, self.format_rule,
                         (f"no letter {self.letters[0]}-{self.letters[-1]} written {self.repeat} times in a row",))
        letter = runs[-1]
        if letter == gold:
            return Grade(1.0, gold * self.repeat, letter * self.repeat, self.format_rule)
        return Grade(0.0, gold * self.repeat, letter * self.repeat, self.format_rule,
                     (f"chose {letter}, the correct choice is {gold}",))


# --------------------------------------------------------------------------- #
# AIME: three digits at the end
# --------------------------------------------------------------------------- #


class ThreeDigitInteger:
    """The last integer in the answer, which must be written with exactly three digits (``025``)."""

    format_rule = "an integer 000-999 written with exactly three digits (leading zeros) as the last part of the answer"
    _last_int = re.compile(r"(\d+)(?!.*\d)", re.DOTALL)

    def grade(self, expected: str, answer: str) -> Grade:
        gold = expected.strip()
        m = self._last_int.search(answer or "")
        if m is None:
            return Grade(0.0, gold, None, self.format_rule, ("no integer found in the answer",))
        got = m.group(1)
        if got == gold:
            return Grade(1.0, gold, got, self.format_rule)
        if int(got) == int(gold):
            return Grade(0.0, gold, got, self.format_rule,
                         (f"the value is right but must be written with three digits: {gold}",))
        return Grade(0.0, gold, got, self.format_rule, (f"{got} is not the answer",))


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


class ExpressionOrdering:
    """Which expression fills each ``<missing k>`` tag: partial credit ``1 - edit_distance / len(expected)``.

    Reads the integers after the last ``Answer:`` if there is one, else the last
    comma-separated list of integers, else a lone integer.
    """

    format_rule = "a comma-separated list of expression identifiers, one per <missing k> tag in order"
    _after_answer = re.compile(r"answer\s*:(?!.*answer\s*:)(.*)", re.IGNORECASE | re.DOTALL)
    _int_list = re.compile(r"\d+(?:\s*,\s*\d+)+")

    def parse(self, answer: str) -> list[int] | None:
        text = answer or ""
        m = self._after_answer.search(text)
        if m is not None and re.search(r"\d", m.group(1)):
            return [int(n) for n in re.findall(r"\d+", m.group(1))]
        lists = self._int_list.findall(text)
        if lists:
            return [int(n) for n in re.findall(r"\d+", lists[-1])]
        stripped = text.strip()
        return [int(stripped)] if stripped.isdigit() else None

    def grade(self, expected: str, answer: str) -> Grade:
        gold = [int(n) for n in re.findall(r"\d+", expected)]
        expected_text = ", ".join(map(str, gold))
        got = self.parse(answer)
        if not got:
            return Grade(0.0, expected_text, None, self.format_rule, ("no list of expression identifiers found",))
        score = max(0.0, 1.0 - edit_distance(got, gold) / len(gold))
        problems = []
        wrong = [k for k in range(len(gold)) if k >= len(got) or got[k] != gold[k]]
        if wrong:
            shown = "; ".join(
                f"<missing {k + 1}> is expression {gold[k]}, not {got[k] if k < len(got) else 'missing'}"
                for k in wrong[:12]
            )
            more = f" (and {len(wrong) - 12} more)" if len(wrong) > 12 else ""
            problems.append(f"{len(wrong)} of {len(gold)} positions wrong: {shown}{more}")
        if len(got) != len(gold):
            problems.append(f"gave {len(got)} identifiers for {len(gold)} tags")
        return Grade(score, expected_text, ", ".join(map(str, got)), self.format_rule, tuple(problems))


# --------------------------------------------------------------------------- #
# AMPS_Hard: symbolic equivalence of LaTeX answers
# --------------------------------------------------------------------------- #


def last_boxed(text: str) -> str | None:
    r"""Content of the last ``\boxed{...}`` (or ``\fbox{...}``), braces balanced; None if there is none."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    if not starts:
        return None
    start = starts[-1]
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


_LATEX_NOISE = (
    (re.compile(r"\\(?:displaystyle|qquad|quad)\b|\\[!,;: ]"), " "),
    (re.compile(r"\\[dt]frac"), r"\\frac"),
    (re.compile(r"\\frac\s*(\d)\s*(\d)"), r"\\frac{\1}{\2}"),  # \frac45 shorthand
    (re.compile(r"\\sqrt\s*(\d)"), r"\\sqrt{\1}"),  # \sqrt2 shorthand
    (re.compile(r"\\log\b"), r"\\ln"),  # AMPS (Mathematica) writes \log for the natural log
    (re.compile(r"\\operatorname\{(\w+)\}"), r"\\\1"),
    (re.compile(r"\+\s*(?:C|c|\\text\{[^}]*\})\s*$"), ""),  # "+ C" of an antiderivative
)


def _final_expression(answer: str) -> str:
    """The LaTeX to grade: last \\boxed{}, else the last $...$ math, else the text; right side of a final '='."""
    text = answer or ""
    boxed = last_boxed(text)
    if boxed is None:
        maths = re.findall(r"\$\$?(.+?)\$?\$", text, re.DOTALL)
        boxed = maths[-1] if maths else re.sub(r"^\s*(?:final\s+)?answer\s*:\s*", "", text, flags=re.IGNORECASE)
    expr = boxed.strip().strip("$").strip().rstrip(".").strip()
    if "=" in expr:
        expr = expr.rsplit("=", 1)[1]
    for pattern, repl in _LATEX_NOISE:
        expr = pattern.sub(repl, expr)
    return expr.strip()


def _to_sympy(latex: str) -> sympy.Expr:
    from latex2sympy2_extended import latex2sympy

    if len(latex) > MAX_LATEX_CHARS:
        raise ValueError(f"answer longer than {MAX_LATEX_CHARS} characters")
    expr = latex2sympy(latex)
    if not isinstance(expr, sympy.Expr):
        raise ValueError(f"not a single expression: {expr}")
    # AMPS uses i for the imaginary unit (e.g. geometric means of negative numbers).
    return expr.subs(sympy.Symbol("i"), sympy.I)


# Deterministic evaluation points, away from 0 and from the integers where
# trigonometric and logarithmic answers have special values.
_POINTS = (0.6180339, 1.3247179, 0.4142135, 2.2360679, 1.7320508, 0.8660254, 3.1415926)


def _values(expr: sympy.Expr, symbols: Sequence[sympy.Symbol]) -> list[complex | None]:
    out: list[complex | None] = []
    for k, base in enumerate(_POINTS):
        subs = {s: base + 0.1 * j for j, s in enumerate(symbols)}
        try:
            value = complex(expr.evalf(20, subs=subs))
        except (TypeError, ValueError, ZeroDivisionError, OverflowError):
            value = None
        if value is not None and not (math.isfinite(value.real) and math.isfinite(value.imag)):
            value = None
        out.append(value)
    return out


def _same_up_to(gold: sympy.Expr, pred: sympy.Expr, symbols: Sequence[sympy.Symbol], constant: bool) -> bool:
    """Numerically equal at every shared evaluation point (or differing by one constant, for antiderivatives)."""
    pairs = [(g, p) for g, p in zip(_values(gold, symbols), _values(pred, symbols)) if g is not None and p is not None]
    if len(pairs) < 3:
        return False
    diffs = [g - p for g, p in pairs]
    offset = diffs[0] if constant else 0
    return all(abs(d - offset) <= 1e-7 * max(1.0, abs(g)) for d, (g, _) in zip(diffs, pairs))


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


@dataclass(frozen=True)
class _Form:
    """A shape the answer must have beyond being equal (e.g. factored), with the words to say so."""

    check: Callable[[sympy.Expr, sympy.Symbol], bool]
    requirement: str


class SymbolicEquivalence:
    r"""The final LaTeX answer (last ``\boxed{}``) equals the ground truth as a function of its variables.

    Equality is checked numerically at fixed points (robust, cannot hang, unlike
    ``simplify``); ``up_to_constant`` accepts any antiderivative; ``form`` adds a shape
    requirement (factoring and completing the square ask for a form, not a value, so
    the question's own polynomial must not pass); decimals are rejected where the
    question asks for an exact answer.
    """

    def __init__(self, *, up_to_constant: bool = False, form: _Form | None = None, note: str = "") -> None:
        self.up_to_constant = up_to_constant
        self.form = form
        rule = r"an exact LaTeX expression inside \boxed{...}"
        self.format_rule = rule + (f", {note}" if note else "") + (f", {form.requirement}" if form else "")

    def grade(self, expected: str, answer: str) -> Grade:
        gold_latex = _final_expression(expected)
        got_latex = _final_expression(answer)
        shown = rf"\boxed{{{expected.strip()}}}"
        if not got_latex:
            return Grade(0.0, shown, None, self.format_rule, (r"no final answer found (put it in \boxed{...})",))
        try:
            gold = _to_sympy(gold_latex)
        except Exception:  # noqa: BLE001 - one released question's reference is Mathematica's "$Aborted"
            return Grade(0.0, shown, got_latex, self.format_rule,
                         ("the reference answer is not a mathematical expression; this question cannot be scored",))
        try:
            pred = _to_sympy(got_latex)
        except Exception as exc:  # noqa: BLE001 - any parse failure of model output is a wrong answer
            return Grade(0.0, shown, got_latex, self.format_rule, (f"the answer is not parseable LaTeX ({exc})",))
        extra = sorted(map(str, pred.free_symbols - gold.free_symbols))
        if extra:
            return Grade(0.0, shown, got_latex, self.format_rule,
                         (f"uses variables the answer does not have: {', '.join(extra)}",))
        if pred.atoms(sympy.Float) and not gold.atoms(sympy.Float):
            return Grade(0.0, shown, got_latex, self.format_rule,
                         ("gives a decimal approximation; the question asks for an exact answer",))
        symbols = sorted(gold.free_symbols, key=str)
        if not _same_up_to(gold, pred, symbols, self.up_to_constant):
            return Grade(0.0, shown, got_latex, self.format_rule, ("not equivalent to the expected answer",))
        if self.form is not None and symbols and not self.form.check(pred, symbols[0]):
            return Grade(0.0, shown, got_latex, self.format_rule,
                         (f"equal in value but not {self.form.requirement}",))
        return Grade(1.0, shown, got_latex, self.format_rule)


# --------------------------------------------------------------------------- #
# Dispatch
# --------------------------------------------------------------------------- #

_MULTIPLE_CHOICE = MultipleChoice()
_AMPS = SymbolicEquivalence()

# Most specific prefix first; the first prefix that a subtask starts with wins.
SCORERS: tuple[tuple[str, Scorer], ...] = (
    ("amc_", _MULTIPLE_CHOICE),
    ("updated_amc_", _MULTIPLE_CHOICE),
    ("smc", _MULTIPLE_CHOICE),
    ("aime_", ThreeDigitInteger()),
    ("usamo", ExpressionOrdering()),
    ("imo", ExpressionOrdering()),
    ("amps_hard_integral", SymbolicEquivalence(up_to_constant=True, note="any antiderivative (the constant may differ)")),
    ("amps_hard_factor_polynomials", SymbolicEquivalence(form=_Form(_is_factored, "written as a product of linear factors"))),
    ("amps_hard_complete_square", SymbolicEquivalence(form=_Form(_is_completed_square, "written as a(x-h)^2+k"))),
    ("amps_hard_", _AMPS),
)


def scorer_for(subtask: str) -> Scorer:
    """The scorer for a LiveBench-Math subtask name (e.g. ``aime_i_2024``, ``amps_hard_gcd``, ``usamo``)."""
    for prefix, scorer in SCORERS:
        if subtask.startswith(prefix):
            return scorer
    known = ", ".join(prefix + "*" for prefix, _ in SCORERS)
    raise ValueError(f"no scorer for LiveBench-Math subtask {subtask!r}; known subtask prefixes: {known}")
