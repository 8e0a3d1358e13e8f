"""The synthetic "rule arithmetic" task: made-up named rules, questions about them, a feedback metric.

GEPA benchmarks need a task whose answers *depend on the instruction* in a way
reflection can improve, yet that is free, fast, offline and reproducible. The task:
apply a made-up named rule (``zorp(x) = 3*x + 1``) to a number. The simulated model
(``responder``) knows a rule only if its exact definition is in the instruction, and
the only place a definition ever appears is this metric's feedback on a wrong answer.
"""

from __future__ import annotations

import ast
import random
import re
import threading
from dataclasses import dataclass
from typing import Any

import dspy

from dspy_pxn.programs.split import Split

# Max rule definitions an instruction can hold; smaller than the 12 rules so
# the optimiser must choose (and the frequent rules are worth more).
CAPACITY = 5

X_RANGE = (1, 50)


# --------------------------------------------------------------------------- #
# Rules
# --------------------------------------------------------------------------- #


def _eval_expr(expr: str, x: int) -> int:
    """Evaluate a tiny integer expression in x without `eval` (prompt text is untrusted)."""

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name) and node.id == "x":
            return x
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            return a * b
        raise ValueError(f"unsupported expression: {expr!r}")

    if len(expr) > 200:
        raise ValueError("expression too long")
    return ev(parse(expr.strip(), mode="eval"))


_PARSE_LOCK = threading.Lock()


def parse(source: str, mode: str = "exec") -> ast.AST:
    """``ast.parse`` one thread at a time: CPython 3.11 before 3.11.9 can raise "AST constructor recursion
    depth mismatch" when threads parse at once (python/cpython#106905), and simulated runs parse in every
    rollout thread."""
    with _PARSE_LOCK:
        return ast.parse(source, mode=mode)


@dataclass(frozen=True)
class Rule:
    """A named integer function; every expression ends in a constant term so garbling can change it."""

    name: str
    expr: str
    weight: float

    @property
    def definition(self) -> str:
        return f"{self.name}(x) = {self.expr}"

    def apply(self, x: int) -> int:
        return _eval_expr(self.expr, x)


_RULE_SPECS: tuple[tuple[str, str], ...] = (
    ("zorp", "3*x + 1"),
    ("blick", "x*x - 2"),
    ("frim", "2*x + 7"),
    ("quax", "5*x - 3"),
    ("dreb", "x*x + x + 4"),
    ("snell", "7*x + 11"),
    ("plome", "4*x - 9"),
    ("vusk", "2*x*x + 5"),
    ("trag", "9*x + 2"),
    ("mirl", "6*x - 13"),
    ("gorp", "x*x - 3*x + 8"),
    ("wemb", "11*x + 6"),
)

# Zipf weights (1/rank): the top CAPACITY rules cover ~74% of questions, so a
# full instruction of the *right* rules beats one of arbitrary rules.
RULES: tuple[Rule, ...] = tuple(
    Rule(name, expr, 1.0 / (rank + 1)) for rank, (name, expr) in enumerate(_RULE_SPECS)
)
RULES_BY_NAME: dict[str, Rule] = {r.name: r for r in RULES}


def seed_instruction() -> str:
    """The starting instruction: task description only, so the seed program scores ~0."""
    return "Apply the named rule to the number and give the integer result."


def seed_program() -> dspy.Module:
    """The program every benchmark, example and test starts from: CoT with the seed instruction."""
    program = dspy.ChainOfThought("question -> answer")
    program.predict.signature = program.predict.signature.with_instructions(seed_instruction())
    return program


# --------------------------------------------------------------------------- #
# Data
# --------------------------------------------------------------------------- #


def make_examples(n: int, seed: int) -> list[dspy.Example]:
    """`n` questions with rules drawn by Zipf weight and x uniform in 1..50, fixed by `seed`."""
    rng = random.Random(seed)
    weights = [r.weight for r in RULES]
    out = []
    for _ in range(n):
        rule = rng.choices(RULES, weights=weights, k=1)[0]
        x = rng.randint(*X_RANGE)
        out.append(
            dspy.Example(question=f"Apply rule {rule.name} to {x}.", answer=str(rule.apply(x)), rule=rule.name)
            .with_inputs("question")
        )
    return out


def make_splits(seed: int = 0, train: int = 60, val: int = 30, test: int = 100) -> Split:
    """Three splits drawn from distinct derived seeds (so they are independent samples)."""
    base = 1000 * seed
    return Split(
        make_examples(train, base + 1),
        make_examples(val, base + 2),
        make_examples(test, base + 3),
    )


# --------------------------------------------------------------------------- #
# Metric
# --------------------------------------------------------------------------- #

_QUESTION_RE = re.compile(r"rule\s+([A-Za-z_]+)\s+to\s+(-?\d+)", re.IGNORECASE)
_INT_RE = re.compile(r"-?\d+")


def _parse_int(value: Any) -> int | None:
    if value is None:
        return None
    text = str(value).strip()
    try:
        return int(text)
    except ValueError:
        m = _INT_RE.search(text)
        return int(m.group()) if m else None


def metric(gold, pred, trace=None, pred_name=None, pred_trace=None) -> dspy.Prediction:
    """GEPA feedback metric: exact integer match; the feedback on a miss reveals the rule's definition.

    Revealing the definition is what lets reflection learn: it is the only
    place the canonical definitions ever appear.
    """
    expected = _parse_int(gold.get("answer") if hasattr(gold, "get") else getattr(gold, "answer", None))
    got = _parse_int(getattr(pred, "answer", None)) if pred is not None else None
    if expected is not None and got == expected:
        return dspy.Prediction(score=1.0, feedback="Correct.")
    name = gold.get("rule") if hasattr(gold, "get") else None
    if not name:
        m = _QUESTION_RE.search(str(gold.get("question", "")) if hasattr(gold, "get") else "")
        name = m.group(1).lower() if m else None
    rule = RULES_BY_NAME.get(name or "")
    feedback = f"Wrong: expected {expected}."
    if rule is not None:
        feedback += f" Rule definition: {rule.definition}."
    return dspy.Prediction(score=0.0, feedback=feedback)


def mlflow_scorer() -> Any:
    """The task's metric as an MLflow GenAI scorer (``rule_match``), for ``mlflow.genai.optimize_prompts``: its
    score, and its feedback as the rationale a reflection reads. Rows carry the answer as
    ``expectations["expected_response"]`` (MLflow's name for a row's ``outputs``). Needs mlflow."""
    from mlflow.entities import Feedback
    from mlflow.genai.scorers import scorer

    @scorer(name="rule_match")
    def rule_match(inputs: dict[str, Any], outputs: Any, expectations: dict[str, Any]) -> Feedback:
        gold = dspy.Example(question=inputs["question"], answer=expectations["expected_response"])
        verdict = metric(gold, dspy.Prediction(answer=outputs))
        return Feedback(value=verdict.score, rationale=verdict.feedback)

    return rule_match


def score(gold, pred, trace=None) -> float:
    """The metric's score alone, for dspy.Evaluate on held-out data."""
    return metric(gold, pred).score
