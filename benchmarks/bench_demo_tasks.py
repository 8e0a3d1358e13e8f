"""Which real task has a gap an instruction can close for the embedded 0.5B task model?

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
- ``hover``: no LM needed: the recall of queries taken straight from the claim over the
  offline HoVer corpus (``dspy_pxn.programs.demo_corpus``: one document per gold title, its
  text the claims citing it). If a query copied from the claim already finds every gold
  title, no query-writer instruction has anything to win.

    DSPY_PXN_DATA_DIR=/path/to/data nice python benchmarks/bench_demo_tasks.py --family amps --questions 20
"""

from __future__ import annotations

import argparse
import functools
import os
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy
from dspy_pxn.programs.data import livebench_math_example, livebench_math_rows
from dspy_pxn.programs.math_solver import SEED_INSTRUCTION, MathSolver, grade

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
}


def score_one(program: MathSolver, lm: dspy.LM, example: dspy.Example) -> tuple[float, bool]:
    """LiveBench's score and whether LiveBench could read an answer at all."""
    try:
        with dspy.context(lm=lm):
            result = grade(example, program(question=example.question))
        return result.score, result.got is not None
    except Exception:  # noqa: BLE001 - an unparseable answer scores 0, as in the optimizer
        return 0.0, False


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
    parser.add_argument("--family", choices=sorted([*FAMILIES, "hover"]), default="amps")
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--lm", default=DEMO_DEFAULTS["lm"])
    parser.add_argument("--max-tokens", type=int, default=DEMO_DEFAULTS["task_max_tokens"])
    args = parser.parse_args()
    if args.family == "hover":
        return hover_recall(args.questions)
    rows = [r for r in livebench_math_rows() if str(r["subtask"]).startswith(FAMILIES[args.family])]
    rows.sort(key=lambda r: r["question_id"])
    examples = [livebench_math_example(r) for r in rows[: args.questions]]
    lm = build_lm(args.lm, "task", max_tokens=args.max_tokens)
    print(f"{args.family}: {len(examples)} questions, task LM {args.lm}, max_tokens {args.max_tokens}")
    print("| instruction | score | answers read | seconds |\n|---|---|---|---|")
    try:
        with ThreadWorkerPool(2) as pool:
            for name, text in (("seed", SEED_INSTRUCTION), ("hand-written", INSTRUCTIONS[args.family])):
                started = time.perf_counter()
                results = pool.map(functools.partial(score_one, MathSolver(text), lm), examples)
                print(f"| {name} | {sum(s for s, _ in results):.2f}/{len(results)} | "
                      f"{sum(read for _, read in results)}/{len(results)} | {time.perf_counter() - started:.0f} |",
                      flush=True)
    finally:
        stop_local_servers()


if __name__ == "__main__":
    main()
