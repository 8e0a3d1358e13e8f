"""Which real task has a gap an instruction can close for an embedded task model?

Why: the demo must show a held-out gain, and an optimizer can only find one if some
instruction beats the natural seed with this model. Before building a demo on a task, score
the seed and a hand-written instruction that states what the metric's feedback reveals, on
the same questions with the demo's task LM (benchmarks/results/demo.md):

- ``amps``: LiveBench-Math AMPS_Hard (derivatives, integrals, factoring, geometric means):
  LiveBench reads the last ``\\boxed{}`` or ``$...$`` of the answer; the seed's answer field
  says "the final answer only", which a small model may write bare.
- ``olympiad``: LiveBench-Math USAMO/IMO fill-in proofs: the answer is the list of expression
  identifiers, partial credit by edit distance; a seed answer that is not a list scores 0.
- ``amc``: LiveBench-Math AMC/SMC: the letter, written five times.
- ``gsm8k``: the demo's own val + test questions: about a fifth of the 0.5B model's answers
  run into max_tokens, so the hand-written instruction asks for brief reasoning and a bare number.
- ``hover``: no LM needed: the recall of queries taken straight from the claim over the
  offline HoVer corpus (``dspy_pxn.programs.demo_corpus``: one document per gold title, its
  text the claims citing it). If a query copied from the claim already finds every gold
  title, no query-writer instruction has anything to win.

Every LM family also counts the answers cut off at max_tokens. ``--lm`` picks the task model
(the demo's 0.5B by default; ``local:qwen2.5-coder-1.5b`` for the larger embedded model).

    DSPY_PXN_DATA_DIR=/path/to/data nice python benchmarks/bench_demo_tasks.py --family amps --questions 20
    DSPY_PXN_DATA_DIR=/path/to/data nice python benchmarks/bench_demo_tasks.py --family gsm8k
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import time
from collections.abc import Callable

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy
from dspy_pxn.programs import gsm8k
from dspy_pxn.programs.data import livebench_math_example, livebench_math_rows
from dspy_pxn.programs.math_solver import MathSolver, grade

from dspy_pxn.cli import DEMO_DEFAULTS
from dspy_pxn.local import build_lm, stop_local_servers
from dspy_pxn.pools import ThreadWorkerPool

FAMILIES = {
    "amps": ("amps_hard",),
    "olympiad": ("usamo", "imo"),
    "amc": ("amc", "updated_amc", "smc"),
}
INSTRUCTIONS = {
    "amps": "Solve the math problem step by step. In the answer field write only the final exact answer in "
            "LaTeX inside $\\boxed{...}$, for example $\\boxed{4 i \\sqrt{5}}$.",
    "olympiad": "The problem is a proof with <missing N> tags and a numbered list of expressions. Decide which "
                "expression fills each tag. In the answer field write only the expression identifiers in the "
                "order of the tags, separated by commas, for example: 3, 1, 5, 2.",
    "amc": "Solve the problem and pick one of the choices A-E. In the answer field write only that letter five "
           "times in a row, for example CCCCC.",
    "gsm8k": "Solve the math word problem. Reason in at most 5 short sentences, doing each calculation once. "
             "Then give the final answer as a single number with no units.",
}
Scorer = Callable[[dspy.Example, dspy.Prediction], tuple[float, bool]]


class TruncationCounter(logging.Handler):
    """DSPy logs a warning per answer cut off at max_tokens; count them."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += "truncated" in record.getMessage()


def livebench_score(example: dspy.Example, pred: dspy.Prediction) -> tuple[float, bool]:
    """LiveBench's score and whether LiveBench could read an answer at all."""
    result = grade(example, pred)
    return result.score, result.got is not None


def gsm8k_score(example: dspy.Example, pred: dspy.Prediction) -> tuple[float, bool]:
    """The demo metric's score and whether the answer held a number at all."""
    return gsm8k.metric(example, pred).score, gsm8k.parse_number(getattr(pred, "answer", None)) is not None


def score_one(program: dspy.Module, scorer: Scorer, lm: dspy.LM, example: dspy.Example) -> tuple[float, bool]:
    try:
        with dspy.context(lm=lm):
            return scorer(example, program(question=example.question))
    except Exception:  # noqa: BLE001 - an unparseable answer scores 0, as in the optimizer
        return 0.0, False


def livebench_examples(family: str, questions: int) -> list[dspy.Example]:
    rows = [r for r in livebench_math_rows() if str(r["subtask"]).startswith(FAMILIES[family])]
    rows.sort(key=lambda r: r["question_id"])
    return [livebench_math_example(r) for r in rows[:questions]]


def gsm8k_examples() -> list[dspy.Example]:
    """The demo's own val + test questions (its split, seed 0)."""
    d = DEMO_DEFAULTS
    split = gsm8k.load_gsm8k(n_train=d["train_size"], n_val=d["val_size"], n_test=d["test_size"], seed=0)
    return split.val + split.test


def hover_recall(questions: int) -> None:
    import tempfile

    from dspy_pxn.programs.data import load_hover
    from dspy_pxn.programs.demo_corpus import write_claims_corpus
    from dspy_pxn.programs.hover import recall
    from dspy_pxn.programs.retrieval import open_index

    split = load_hover()
    with tempfile.TemporaryDirectory() as scratch:
        index = open_index(corpus=write_claims_corpus(split.train + split.val + split.test, f"{scratch}/corpus.jsonl"))
        claims = split.test[:questions]
        print(f"hover: {len(claims)} test claims, claims corpus of train+val+test\n| query | k | mean recall |\n|---|---|---|")
        queries = {"the claim": lambda c: c, "its first 4 words": lambda c: " ".join(c.split()[:4]),
                   "its capitalised words": lambda c: " ".join(w for w in c.split() if w[:1].isupper())}
        for name, query in queries.items():
            for k in (7, 28):
                found = [recall(e.titles, [p.title for p in index.search(query(e.claim), k)]).score for e in claims]
                print(f"| {name} | {k} | {sum(found) / len(found):.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=sorted([*FAMILIES, "gsm8k", "hover"]), default="amps")
    parser.add_argument("--questions", type=int, default=20, help="LiveBench and HoVer; GSM8K takes the demo's 28")
    parser.add_argument("--lm", default=DEMO_DEFAULTS["lm"])
    parser.add_argument("--max-tokens", type=int, default=DEMO_DEFAULTS["task_max_tokens"])
    args = parser.parse_args()
    if args.family == "hover":
        return hover_recall(args.questions)
    if args.family == "gsm8k":
        examples, seed, scorer = gsm8k_examples(), gsm8k.GSM8KSolver(), gsm8k_score
    else:
        examples, seed, scorer = livebench_examples(args.family, args.questions), MathSolver(), livebench_score
    programs = {"seed": seed, "hand-written": type(seed)(INSTRUCTIONS[args.family])}
    lm = build_lm(args.lm, "task", max_tokens=args.max_tokens)
    counter = TruncationCounter()
    logging.getLogger("dspy.clients.lm").addHandler(counter)
    print(f"{args.family}: {len(examples)} questions, task LM {args.lm}, max_tokens {args.max_tokens}")
    print("| instruction | score | answers read | truncated | seconds |\n|---|---|---|---|---|")
    try:
        with ThreadWorkerPool(2) as pool:
            for name, program in programs.items():
                counter.count, started = 0, time.perf_counter()
                results = pool.map(functools.partial(score_one, program, scorer, lm), examples)
                print(f"| {name} | {sum(s for s, _ in results):.2f}/{len(results)} | "
                      f"{sum(read for _, read in results)}/{len(results)} | {counter.count} | "
                      f"{time.perf_counter() - started:.0f} |", flush=True)
    finally:
        stop_local_servers()


if __name__ == "__main__":
    main()
