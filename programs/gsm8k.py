"""GSM8K: a chain-of-thought solver, a numeric exact-match GEPA metric, and fixed seeded splits.

Why GSM8K for the embedded demo: a 0.5B local model answers grade-school problems in chat
but gets only ~10% of them right (benchmarks/results/local_lm.md), so the seed program is
far from perfect and an instruction that fixes its habits (units, rounding, final number
only) has room to show. The feedback names the expected number and the one parsed from the
answer, which is what a reflector needs to see to write such an instruction.

Data is read in place from ``<data_dir>/gsm8k/{train,test}.jsonl`` (the team's shared
folder; GSM8K is MIT-licensed) and never copied into this repository, or, only when asked
(``online=True``), from the Hugging Face hub's ``openai/gsm8k`` (config ``main``), whose rows
are the same ``{"question", "answer"}`` records; the same seed picks the same rows from either.

    from dspy_pxn.programs.gsm8k import GSM8KSolver, metric, load_gsm8k
    train, val, test = load_gsm8k(n_train=24, n_val=8, n_test=20)   # $DSPY_PXN_DATA_DIR
"""

from __future__ import annotations

import os
import random
import re
from typing import Any

import dspy
from dspy_pxn.programs.data import Split, _load_hub, _not_found, _read_jsonl, resolve_data_dir

__all__ = ["SEED_INSTRUCTION", "GSM8KSolver", "SolveWordProblem", "load_gsm8k", "metric", "parse_number", "score"]

GSM8K_HF = "openai/gsm8k"  # config "main", splits "train" and "test"; MIT

SEED_INSTRUCTION = "Solve the math word problem. Think step by step, then give the final answer."

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


class SolveWordProblem(dspy.Signature):
    """Solve the math word problem. Think step by step, then give the final answer."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField(desc="the final numeric answer")


class GSM8KSolver(dspy.Module):
    """Chain of thought over ``question -> answer``; GEPA's one component is ``solve.predict``."""

    def __init__(self, instruction: str = SEED_INSTRUCTION) -> None:
        super().__init__()
        self.solve = dspy.ChainOfThought(SolveWordProblem.with_instructions(instruction))
        self.metric = metric  # its GEPA feedback metric: BatchedGEPA uses it when given none

    def forward(self, question: str) -> dspy.Prediction:
        return self.solve(question=question)


def parse_number(text: Any) -> float | None:
    """The last number in ``text`` (thousands commas dropped), or None: models append units and words."""
    found = _NUMBER.findall(str(text or ""))
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def _fmt(value: float | None) -> str:
    if value is None:
        return "no number"
    return str(int(value)) if value == int(value) else str(value)


def metric(gold, pred, trace=None, pred_name=None, pred_trace=None) -> dspy.Prediction:
    """1.0 when the last number of the answer equals the gold number; feedback names both numbers."""
    expected = parse_number(getattr(gold, "answer", None))
    got = parse_number(getattr(pred, "answer", None) if pred is not None else None)
    correct = expected is not None and got is not None and abs(got - expected) < 1e-6
    if correct:
        feedback = f"Correct: the expected answer is {_fmt(expected)} and the answer gave {_fmt(got)}."
    else:
        raw = str(getattr(pred, "answer", "") or "")[:200] if pred is not None else ""
        feedback = (
            f"Incorrect: the expected answer is {_fmt(expected)}, but the number read from the answer is "
            f"{_fmt(got)} (answer field: {raw!r}). The answer field must hold only the final number."
        )
    return dspy.Prediction(score=1.0 if correct else 0.0, feedback=feedback)


def score(gold, pred, trace=None) -> float:
    """The metric's score alone, for ``dspy.Evaluate``."""
    return metric(gold, pred).score


def _example(row: dict[str, Any]) -> dspy.Example:
    """GSM8K's gold is the number after '####' in its worked solution."""
    return dspy.Example(question=row["question"], answer=row["answer"].split("####")[-1].strip()).with_inputs(
        "question"
    )


def _rows(
    data_dir: str | os.PathLike[str] | None, split: str, online: bool, hf_kwargs: dict[str, Any]
) -> list[dict[str, Any]]:
    if online:
        return [dict(row) for row in _load_hub(GSM8K_HF, split, "GSM8K", **{"name": "main", **hf_kwargs})]
    root = resolve_data_dir(data_dir)
    path = root / "gsm8k" / f"{split}.jsonl" if root is not None else None
    if path is None or not path.is_file():
        raise _not_found("GSM8K", f"gsm8k/{split}.jsonl", root, GSM8K_HF)
    return _read_jsonl(path)


def load_gsm8k(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    online: bool = False,
    n_train: int = 200,
    n_val: int = 50,
    n_test: int = 200,
    seed: int = 0,
    **hf_kwargs: Any,
) -> Split:
    """Fixed seeded splits: train and val drawn without overlap from GSM8K train, test from GSM8K test.

    The same (sizes, seed) always gives the same examples, so a demo's held-out score is
    comparable across runs; test never comes from the rows the search can see.
    """
    train_rows, test_rows = (_rows(data_dir, split, online, hf_kwargs) for split in ("train", "test"))
    if n_train + n_val > len(train_rows) or n_test > len(test_rows):
        raise ValueError(
            f"GSM8K has {len(train_rows)} train and {len(test_rows)} test rows; asked for "
            f"{n_train}+{n_val} and {n_test}: choose smaller sizes."
        )
    rng = random.Random(seed)
    picked = rng.sample(range(len(train_rows)), n_train + n_val)
    tests = random.Random(seed + 1).sample(range(len(test_rows)), n_test)
    return Split(
        train=[_example(train_rows[i]) for i in picked[:n_train]],
        val=[_example(train_rows[i]) for i in picked[n_train:]],
        test=[_example(test_rows[i]) for i in tests],
    )
