"""Local task LMs on GSM8K-style problems: accuracy and seconds per call, 1 vs 2 server slots.

Why: `dspy-pxn demo` must finish in <= 15 min on a 2-core machine, so its task LM, slot count
and budget are chosen from these numbers (benchmarks/results/local_lm.md).

    nice python benchmarks/bench_local_lm.py --model qwen2.5-coder-0.5b --parallel 2 --n 20

Program: dspy.ChainOfThought("question -> answer") through dspy.LM -> litellm -> llama-server.
Data: the first --n rows of $DSPY_PXN_GSM8K (default ../shared/data/gsm8k/test.jsonl; openai/
grade-school-math, MIT) read in place, never copied. Requests run on --parallel client threads
against a server with --parallel slots, so "2 vs 1" is throughput at equal client pressure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy

from dspy_pxn.local import build_lm, stop_local_servers

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "test.jsonl"
NUMBER = re.compile(r"-?\d[\d,]*\.?\d*")


def load(path: Path, n: int) -> list[dspy.Example]:
    """First n problems; gold is the number after GSM8K's '####'."""
    rows = [json.loads(line) for line in path.read_text().splitlines()[:n]]
    return [
        dspy.Example(question=r["question"], answer=r["answer"].split("####")[-1].strip()).with_inputs("question")
        for r in rows
    ]


def to_number(text: str | None) -> float | None:
    """The last number in text (commas dropped), or None."""
    found = NUMBER.findall(text or "")
    try:
        return float(found[-1].replace(",", "").rstrip(".")) if found else None
    except ValueError:
        return None


def run(args: argparse.Namespace) -> dict:
    data = load(Path(args.data), args.n)
    lm = build_lm(
        f"local:{args.model}", parallel=args.parallel, grammar=not args.no_grammar, max_tokens=args.max_tokens
    )
    program = dspy.ChainOfThought("question -> answer")

    def one(ex: dspy.Example) -> tuple[float, bool, bool]:
        t0 = time.perf_counter()
        try:
            with dspy.context(lm=lm):
                pred = program(question=ex.question)
            parsed, got = True, to_number(pred.answer)
        except Exception:  # noqa: BLE001 - a parse failure is a measured outcome
            parsed, got = False, None
        return time.perf_counter() - t0, parsed, got is not None and abs(got - float(ex.answer.replace(",", ""))) < 1e-6

    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(one, data))
    wall = time.perf_counter() - t0
    stop_local_servers()
    secs = [r[0] for r in results]
    return {
        "model": args.model, "parallel": args.parallel, "grammar": not args.no_grammar, "n": len(data),
        "accuracy": sum(r[2] for r in results) / len(data), "parsed": sum(r[1] for r in results),
        "wall_s": round(wall, 1), "s_per_call_mean": round(statistics.mean(secs), 2),
        "s_per_call_median": round(statistics.median(secs), 2), "calls_per_min": round(60 * len(data) / wall, 2),
        "loadavg_1m_before": round(load0, 2), "loadavg_1m_after": round(os.getloadavg()[0], 2),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--parallel", type=int, default=2, help="server slots = client threads")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--no-grammar", action="store_true")
    ap.add_argument("--data", default=os.environ.get("DSPY_PXN_GSM8K", str(DEFAULT_DATA)))
    print(json.dumps(run(ap.parse_args())), flush=True)


if __name__ == "__main__":
    main()
