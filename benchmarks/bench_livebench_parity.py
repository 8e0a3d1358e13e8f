r"""Parity check: dspy_pxn.programs.math_scoring against LiveBench's own grading functions.

Builds several thousand answers from all 368 LiveBench-Math questions — the gold answer
alone and inside chain-of-thought text (boxed, bold, "Final answer:", trailing prose,
<think> blocks), plausible wrong answers, near misses, changed minds, equivalent forms and
edge cases — and scores each with our scorer and with LiveBench's functions, imported at
run time from YOUR LiveBench checkout (nothing of LiveBench is copied into this
repository). Prints, per subtask family, the cases, those LiveBench leaves to its LLM
judge (excluded: LiveBench has no rule-based verdict for them), agreements and
disagreements, with examples of each disagreement.

    python benchmarks/bench_livebench_parity.py --livebench PATH/TO/LiveBench [--data-dir DIR]

What is needed and how LiveBench is called:

* ``--livebench``: a checkout of https://github.com/LiveBench/LiveBench (the directory that
  holds ``livebench/``). The script imports ``livebench.process_results.math.*`` from it;
  those modules need ``sympy`` and ``lark`` (``pip install lark``). The per-task dispatch and
  the removal of ``<think>`` blocks of ``livebench/gen_ground_truth_judgment.py``
  (``play_a_match_gt``) are restated in :func:`livebench_score` rather than imported:
  that module imports every task's dependencies.
* LiveBench's LLM judge (``is_equiv_llm``, AMPS_Hard only) is replaced by a stub that
  marks the case "needs judge" and is never called over the network; OPENAI_API_KEY is
  set to a placeholder in this process only so that LiveBench's key check reaches it.
* ``--latex2sympy2 DIR`` (recommended): LiveBench's fallback LaTeX parser is
  ``latex2sympy2==1.9.1``, which needs ``antlr4-python3-runtime==4.7.2`` and so cannot share
  an environment with ``latex2sympy2_extended`` (antlr 4.9+). Install it apart with
  ``pip install --no-deps --target DIR latex2sympy2==1.9.1 antlr4-python3-runtime==4.7.2``;
  the script imports it with that antlr4 and then restores ours. Without it LiveBench's
  fallback parse fails as it does when the package is missing, and the answers only that
  parser could read are counted as needing the judge.
* An exception raised by LiveBench's grader counts as LiveBench's score 0, as
  ``play_a_match_gt`` records it (eval_error, score 0).
* LiveBench's side is slow: each comparison runs sympy's ``simplify`` in a subprocess with a
  60 s timeout, twice per pair of (ambiguous) parses, so one wrong derivative can take eight
  minutes. The script runs each distinct ``simplify`` once (the second call is identical) and
  ``--simplify-timeout S`` lowers LiveBench's 60 s cap; a time-out then counts as it does in
  LiveBench (not proven equal), and the table reports apart the judge cases in which one
  occurred, since with the full 60 s LiveBench might have proven those equal. ``--jobs N``
  runs N worker processes; ``--cache FILE`` keeps LiveBench's verdicts, so a re-run after
  changing our scorer takes seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import multiprocessing
import os
import random
import re
import subprocess
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dspy_pxn.programs.data import livebench_math_rows  # noqa: E402
from dspy_pxn.programs.math_scoring import _to_sympy, choice_value, scorer_for  # noqa: E402

JUDGE = "needs judge"
_CUT = "needs judge, simplify cut"  # a simplify hit --simplify-timeout (below LiveBench's 60 s)
FAMILIES = ("AIME", "AMC/SMC", "olympiad", "AMPS_Hard")


# --------------------------------------------------------------------------- #
# LiveBench's functions, from the user's checkout
# --------------------------------------------------------------------------- #


class JudgeNeeded(Exception):
    """Raised by the stub that replaces LiveBench's LLM judge."""


def _load_latex2sympy2(site: Path) -> None:
    """Import latex2sympy2 1.9.1 with its own antlr4 4.7.2 from ``site``, then put our antlr4 back."""
    ours = {k: v for k, v in sys.modules.items() if k == "antlr4" or k.startswith("antlr4.")}
    for k in ours:
        del sys.modules[k]
    sys.path.insert(0, str(site))
    try:
        import latex2sympy2  # noqa: F401 - kept alive in sys.modules for LiveBench's fallback import
    finally:
        sys.path.remove(str(site))
        for k in [k for k in sys.modules if k == "antlr4" or k.startswith("antlr4.")]:
            del sys.modules[k]
        sys.modules.update(ours)


SIMPLIFY_TIMEOUT = [60.0]  # LiveBench's own cap; set from --simplify-timeout
TIMED_OUT = [False]  # whether a simplify of the current case hit the cap


def _capped_and_memoised(run_with_timeout: Callable[..., Any]) -> Callable[..., Any]:
    """LiveBench's run_with_timeout, with our cap and each distinct call run once per case."""
    memo: dict[str, Any] = {}

    def run(func: Callable[..., Any], args: tuple = (), timeout: float = 8) -> Any:
        key = f"{getattr(func, '__name__', func)}{args!r}"
        if key not in memo and len(memo) > 256:
            memo.clear()
        if key not in memo:
            try:
                memo[key] = run_with_timeout(func, args, min(timeout, SIMPLIFY_TIMEOUT[0]))
            except Exception as exc:  # noqa: BLE001 - replayed below, as LiveBench would see it again
                TIMED_OUT[0] = TIMED_OUT[0] or isinstance(exc, TimeoutError)
                memo[key] = exc
        result = memo[key]
        if isinstance(result, Exception):
            raise result
        return result

    return run


@dataclass
class LiveBench:
    mathcontest: Callable[..., int]
    aime: Callable[..., int]
    olympiad: Callable[..., float]
    amps: Callable[..., int]


def import_livebench(checkout: Path, latex2sympy2_site: Path | None) -> LiveBench:
    # Our parser first, so its antlr4 is the one restored after latex2sympy2's.
    _to_sympy("x+1")
    if latex2sympy2_site is not None:
        _load_latex2sympy2(latex2sympy2_site)
    sys.path.insert(0, str(checkout))
    from livebench.process_results.math.AMPS_Hard import utils as amps
    from livebench.process_results.math.math_competitions import utils as competitions
    from livebench.process_results.math.olympiad import utils as olympiad

    def judge_stub(x1: str, x2: str) -> bool:
        raise JudgeNeeded

    amps.is_equiv_llm = judge_stub
    amps.run_with_timeout = _capped_and_memoised(amps.run_with_timeout)
    os.environ.setdefault("OPENAI_API_KEY", "placeholder-the-judge-is-stubbed")
    return LiveBench(competitions.mathcontest_process_results, competitions.aime_process_results,
                     olympiad.proof_rearrangement_process_results, amps.amps_hard_process_results)


def _commit(checkout: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown: not a git checkout"


def livebench_score(lb: LiveBench, row: dict[str, Any], answer: str) -> float | str:
    """LiveBench's score for one answer, as play_a_match_gt dispatches it, or JUDGE."""
    TIMED_OUT[0] = False
    text = re.sub(r"<think>.*?</think>", "", answer, flags=re.DOTALL)
    gold, subtask = row["ground_truth"], row["subtask"]
    words = subtask.split("_")
    quiet = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            warnings.simplefilter("ignore")
            if words[0] in ("amc", "smc") or (len(words) > 1 and words[1] == "amc"):
                return float(lb.mathcontest(gold, text, row["turns"][0]))
            if words[0] == "aime":
                return float(lb.aime(gold, text))
            if words[0] in ("imo", "usamo"):
                return float(lb.olympiad(gold, text, edit_distance=True))
            return float(lb.amps(gold, text))
    except JudgeNeeded:
        return _CUT if TIMED_OUT[0] and SIMPLIFY_TIMEOUT[0] < 60 else JUDGE
    except Exception:  # noqa: BLE001 - LiveBench records an eval_error with score 0
        return 0.0


class VerdictCache:
    """LiveBench's verdicts by (subtask, reference, question, answer), kept in a JSON file."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.verdicts: dict[str, float | str] = json.loads(path.read_text()) if path and path.exists() else {}
        self.unsaved = 0

    @staticmethod
    def key(row: dict[str, Any], answer: str) -> str:
        parts = (row["subtask"], row["ground_truth"], row["turns"][0], answer)
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()

    def get(self, key: str) -> float | str | None:
        """A kept verdict; one cut short by a lower --simplify-timeout than the current one is not kept."""
        verdict = self.verdicts.get(key)
        if isinstance(verdict, list):  # [_CUT, the timeout it was cut at]
            return _CUT if verdict[1] >= SIMPLIFY_TIMEOUT[0] else None
        return verdict

    def put(self, key: str, verdict: float | str) -> None:
        self.verdicts[key] = [_CUT, SIMPLIFY_TIMEOUT[0]] if verdict == _CUT else verdict
        self.unsaved += 1

    def save(self) -> None:
        if self.path is not None and self.unsaved:
            self.path.write_text(json.dumps(self.verdicts))
            self.unsaved = 0


def family(subtask: str) -> str:
    words = subtask.split("_")
    if words[0] == "aime":
        return "AIME"
    if words[0] in ("imo", "usamo"):
        return "olympiad"
    if "amps_hard" in subtask:
        return "AMPS_Hard"
    return "AMC/SMC"


# --------------------------------------------------------------------------- #
# Answers
# --------------------------------------------------------------------------- #

REASONING = (
    "Let me work through this step by step.\nFirst, 3 + 4 = 7 and 12 / 4 = 3, so the two cases agree.\n"
    "Checking the boundary case separately gives the same result.\n\n",
    "We start from the definitions. Substituting $x = 2$ gives $2^2 + 1 = 5$, which rules out the small values; "
    "the remaining case needs a careful count.\n\n",
    "**Step 1.** Set up the equation.\n**Step 2.** Solve it: the candidates are 10, 20 and 30.\n"
    "**Step 3.** Only one candidate satisfies every condition.\n\n",
)
PROSE = "\n\nI hope this helps! Let me know if you would like me to go through any of the steps in more detail."


def cot(k: int, ending: str) -> str:
    return REASONING[k % len(REASONING)] + ending


def multiple_choice_answers(row: dict[str, Any], rng: random.Random) -> Iterator[tuple[str, str]]:
    g = row["ground_truth"]
    o = rng.choice([c for c in "ABCDE" if c != g])
    v, vo = choice_value(row["turns"][0], g), choice_value(row["turns"][0], o)
    yield "gold x5", g * 5
    yield "cot gold x5", cot(0, g * 5)
    yield "cot bold x5", cot(1, f"**{g * 5}**")
    yield "cot gold x5 + prose", cot(2, g * 5 + PROSE)
    yield "cot gold x4", cot(0, g * 4)
    yield "cot gold x3", cot(1, g * 3)
    yield "cot lowercase x5", cot(2, g.lower() * 5)
    yield "cot boxed letter", cot(0, f"The answer is $\\boxed{{{g}}}$.")
    yield "cot boxed text letter", cot(1, f"$\\boxed{{\\text{{{g}}}}}$")
    yield "cot boxed (letter)", cot(2, f"$\\boxed{{\\textbf{{({g})}}}}$")
    yield "cot fbox letter", cot(0, f"\\fbox{{{g}}}")
    yield "cot boxed-space letter", cot(1, f"\\boxed {g}")
    yield "cot boxed unclosed", cot(2, f"\\boxed{{{g}")
    yield "cot boxed no brace", cot(0, f"\\boxed\\text{{{g}}}")
    yield "cot Final answer: letter", cot(1, f"Final answer: {g}")
    yield "cot Final answer: (letter)", cot(2, f"Final answer: ({g})")
    yield "cot letter last line", cot(0, g)
    yield "cot bold letter last line", cot(1, f"**{g}**")
    yield "cot value", cot(2, f"The answer is {v}.")
    yield "cot value + prose", cot(0, f"So the answer is {v}." + PROSE)
    yield "cot value then letter x5", cot(1, f"The value is {v}, choice {g}: {g * 5}")
    yield "cot solution tag", cot(2, f"<solution>{g}</solution>")
    yield "cot solution tag wrong", cot(0, f"<solution>{o * 5}</solution>")
    yield "wrong x5", o * 5
    yield "cot wrong x5", cot(1, o * 5)
    yield "cot wrong boxed", cot(2, f"$\\boxed{{{o}}}$")
    yield "cot wrong (letter)", cot(0, f"Final answer: ({o})")
    yield "cot wrong value", cot(1, f"The answer is {vo}.")
    yield "changed mind to gold", cot(2, f"{o * 5}\nWait, that is wrong. The answer is {g * 5}")
    yield "changed mind from gold", cot(0, f"{g * 5}\nWait, that is wrong. The answer is {o * 5}")
    yield "think wrong, answer gold", f"<think>Maybe {o * 5}.</think>{cot(1, g * 5)}"
    yield "think gold, answer wrong", f"<think>Maybe {g * 5}.</think>{cot(2, o * 5)}"
    yield "empty", ""
    yield "no answer", cot(0, "I cannot determine the answer.")


def aime_answers(row: dict[str, Any], rng: random.Random) -> Iterator[tuple[str, str]]:
    g = row["ground_truth"]
    n = int(g)
    near = f"{(n + 1) % 1000:03d}"
    yield "gold", g
    yield "cot gold", cot(0, f"The answer is {g}")
    yield "cot boxed gold", cot(1, f"$\\boxed{{{g}}}$")
    yield "cot bold gold", cot(2, f"**{g}**")
    yield "cot Final answer:", cot(0, f"Final answer: {g}")
    yield "cot gold + short prose", cot(1, f"So the answer is {g}. Done.")
    yield "cot gold + long prose", cot(2, f"So the answer is {g}." + PROSE)
    yield "cot unpadded", cot(0, f"The answer is {n}")
    yield "cot boxed unpadded", cot(1, f"$\\boxed{{{n}}}$")
    yield "cot near miss", cot(2, f"The answer is {near}")
    yield "cot gold inside a longer number", cot(0, f"The answer is 1{g}")
    yield "cot gold then near miss", cot(1, f"I first got {g}, but rechecking, it is {near}")
    yield "cot near miss then gold", cot(2, f"I first got {near}, but rechecking, it is {g}")
    yield "cot gold early, wrong last", cot(0, f"The answer is {g}." + PROSE + f" Actually it is {near}.")
    yield "cot solution tag", cot(1, f"<solution>{g}</solution>")
    yield "think gold, answer wrong", f"<think>It is {g}.</think>" + cot(2, f"The answer is {near}")
    yield "think wrong, answer gold", f"<think>It is {near}.</think>" + cot(0, f"The answer is {g}")
    yield "cot gold as words", cot(1, "The answer is twenty-five.")
    yield "cot spaced digits", cot(2, f"The answer is {' '.join(g)}")
    yield "empty", ""


def olympiad_answers(row: dict[str, Any], rng: random.Random) -> Iterator[tuple[str, str]]:
    ids = row["ground_truth"].split(",")
    listed = ", ".join(ids)
    wrong = ids[:]
    if len(wrong) > 1:
        wrong[0], wrong[1] = wrong[1], wrong[0]
    else:
        wrong = [str(int(ids[0]) + 1)]
    swapped = ", ".join(wrong)
    yield "Answer: gold", f"Answer: {listed}"
    yield "cot Answer: gold", cot(0, f"Answer: {listed}")
    yield "cot Answer: gold + note", cot(1, f"Answer: {listed}\nNote: expression 99 was not needed.")
    yield "cot **Answer:** gold", cot(2, f"**Answer:** {listed}")
    yield "cot Answer: gold.", cot(0, f"Answer: {listed}.")
    yield "cot Answer: newline gold", cot(1, f"Answer:\n{listed}")
    yield "cot Final Answer: gold", cot(2, f"Final Answer: {listed}")
    yield "cot Answer: boxed gold", cot(0, f"Answer: $\\boxed{{{listed}}}$")
    yield "cot Answer: <gold>", cot(1, "Answer: " + ", ".join(f"<{i}>" for i in ids))
    yield "cot Answer: expression ids", cot(2, "Answer: " + ", ".join(f"expression {i}" for i in ids))
    yield "cot Answer: spaces only", cot(0, "Answer: " + " ".join(ids))
    yield "cot boxed gold", cot(1, f"$\\boxed{{{listed}}}$")
    yield "cot boxed gold + prose", cot(2, f"$\\boxed{{{listed}}}$" + PROSE)
    yield "cot bare gold last line", cot(0, listed)
    yield "cot gold in a sentence", cot(1, f"The order is {listed}.")
    yield "cot Answer: swapped", cot(2, f"Answer: {swapped}")
    yield "cot Answer: reversed", cot(0, "Answer: " + ", ".join(reversed(ids)))
    yield "cot Answer: one missing", cot(1, "Answer: " + ", ".join(ids[:-1]))
    yield "cot Answer: one extra", cot(2, f"Answer: {listed}, 99")
    yield "cot Answer: twice as long", cot(0, f"Answer: {listed}, {listed}")
    yield "changed mind to gold", cot(1, f"Answer: {swapped}\nOn reflection:\nAnswer: {listed}")
    yield "changed mind from gold", cot(2, f"Answer: {listed}\nOn reflection:\nAnswer: {swapped}")
    yield "Answer: twice on a line", cot(0, f"Answer: {listed} answer: {swapped}")
    yield "think gold, answer wrong", f"<think>Answer: {listed}</think>" + cot(1, f"Answer: {swapped}")
    yield "cot Answer: gold, unreadable item", cot(2, f"Answer: {listed}, ²")
    yield "cot superscript digit last", cot(0, "The last one is ³")
    yield "cot no answer", cot(1, "I could not finish.")
    yield "empty", ""


def _amps_forms(gold: str) -> Iterator[tuple[str, str]]:
    """Equivalent, decimal and negated forms of the reference, where our parser reads it."""
    import sympy

    try:
        expr = _to_sympy(gold.replace("\\left", "").replace("\\right", ""))
    except Exception:  # noqa: BLE001 - "$Aborted"
        return
    yield "sympy latex", sympy.latex(expr)
    yield "expanded", sympy.latex(sympy.expand(expr))
    yield "negated", f"-\\left({gold}\\right)"
    yield "doubled", f"2\\left({gold}\\right)"
    yield "plus one", f"{gold}+1"
    if not expr.free_symbols:
        value = complex(expr.evalf())
        if abs(value.imag) < 1e-12:
            yield "4 decimals", f"{value.real:.4f}"
            yield "2 decimals", f"{value.real:.2f}"
            yield "off by 0.0005", f"{value.real + 0.0005:.6f}"
            yield "off by 0.002", f"{value.real + 0.002:.6f}"


def amps_answers(row: dict[str, Any], rng: random.Random, others: list[str]) -> Iterator[tuple[str, str]]:
    g = row["ground_truth"]
    other = rng.choice([o for o in others if o != g] or [g + "+1"])
    dfrac = g.replace("\\frac", "\\dfrac")
    cdot = re.sub(r"(\d) ([a-z(])", r"\1 \\cdot \2", g)
    yield "boxed gold", f"\\boxed{{{g}}}"
    yield "cot $boxed gold$", cot(0, f"So the result is $\\boxed{{{g}}}$.")
    yield "cot boxed gold + prose", cot(1, f"$$\\boxed{{{g}}}$$" + PROSE)
    yield "cot $gold$", cot(2, f"The answer is ${g}$.")
    yield "cot $$gold$$", cot(0, f"The answer is\n$$\n{g}\n$$")
    yield "cot Final answer: gold", cot(1, f"Final answer: {g}")
    yield "cot Final answer: gold.", cot(2, f"Final answer: {g}.")
    yield "cot Final answer: $gold$", cot(0, f"Final answer: ${g}$")
    yield "cot **Final answer:** boxed", cot(1, f"**Final answer:** $\\boxed{{{g}}}$")
    yield "cot bold gold", cot(2, f"**{g}**")
    yield "bare gold", g
    yield "cot boxed y = gold", cot(0, f"$\\boxed{{y = {g}}}$")
    yield "cot boxed gold + C", cot(1, f"$\\boxed{{{g} + C}}$")
    yield "cot boxed dfrac", cot(2, f"$\\boxed{{{dfrac}}}$")
    yield "cot boxed cdot", cot(0, f"$\\boxed{{{cdot}}}$")
    yield "cot boxed-space gold", cot(1, f"\\boxed {g}")
    yield "cot fbox gold", cot(2, f"\\fbox{{{g}}}")
    yield "cot wrong boxed", cot(0, f"$\\boxed{{{other}}}$")
    yield "cot wrong $..$", cot(1, f"The answer is ${other}$.")
    yield "cot Final answer: wrong", cot(2, f"Final answer: {other}")
    yield "changed mind to gold", cot(0, f"$\\boxed{{{other}}}$ Wait, I made an error. $\\boxed{{{g}}}$")
    yield "changed mind from gold", cot(1, f"$\\boxed{{{g}}}$ Wait, I made an error. $\\boxed{{{other}}}$")
    yield "think gold, answer wrong", f"<think>$\\boxed{{{g}}}$</think>" + cot(2, f"$\\boxed{{{other}}}$")
    yield "boxed unclosed", cot(0, f"\\boxed{{{g}")
    yield "boxed no brace", cot(1, f"\\boxed\\text{{{g}}}")
    for label, form in _amps_forms(g):
        yield f"boxed {label}", cot(2, f"$\\boxed{{{form}}}$")
    yield "empty", ""


def cases(rows: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], str, str]]:
    rng = random.Random(0)
    amps_golds: dict[str, list[str]] = defaultdict(list)
    for row in rows:
        amps_golds[row["subtask"]].append(row["ground_truth"])
    for row in rows:
        kind = family(row["subtask"])
        if kind == "AMC/SMC":
            answers = multiple_choice_answers(row, rng)
        elif kind == "AIME":
            answers = aime_answers(row, rng)
        elif kind == "olympiad":
            answers = olympiad_answers(row, rng)
        else:
            answers = amps_answers(row, rng, amps_golds[row["subtask"]])
        for label, answer in answers:
            yield row, label, answer


# --------------------------------------------------------------------------- #
# Comparison
# --------------------------------------------------------------------------- #


def our_score(row: dict[str, Any], answer: str) -> float:
    return scorer_for(row["subtask"]).grade(row["ground_truth"], answer, row["turns"][0]).score


@dataclass
class Tally:
    cases: int = 0
    judge: int = 0
    cut: int = 0
    agree: int = 0

    @property
    def disagree(self) -> int:
        return self.cases - self.judge - self.agree


_WORKER: dict[str, Any] = {}


def _start_worker(checkout: Path, latex2sympy2_site: Path | None, timeout: float, cache: VerdictCache) -> None:
    SIMPLIFY_TIMEOUT[0] = timeout
    _WORKER.update(lb=import_livebench(checkout, latex2sympy2_site), cache=cache)


def _score_question(batch: list[tuple[dict[str, Any], str, str]]) -> list[tuple[str, float | str, float]]:
    """(cache key, LiveBench's verdict, our score) for each answer to one question."""
    cache: VerdictCache = _WORKER["cache"]
    out = []
    for row, _, answer in batch:
        key = cache.key(row, answer)
        theirs = cache.get(key)
        if theirs is None:
            theirs = livebench_score(_WORKER["lb"], row, answer)
        out.append((key, theirs, our_score(row, answer)))
    return out


def _by_question(rows: list[dict[str, Any]]) -> list[list[tuple[dict[str, Any], str, str]]]:
    batches: dict[str, list[tuple[dict[str, Any], str, str]]] = defaultdict(list)
    for row, label, answer in cases(rows):
        batches[row["question_id"]].append((row, label, answer))
    # The slow AMPS questions first, so that workers finish together.
    return sorted(batches.values(), key=lambda b: family(b[0][0]["subtask"]) != "AMPS_Hard")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--livebench", type=Path, required=True, help="a LiveBench checkout (holds livebench/)")
    parser.add_argument("--data-dir", type=Path, default=None, help="local data dir (default: $DSPY_PXN_DATA_DIR)")
    parser.add_argument("--latex2sympy2", type=Path, default=None,
                        help="a --target dir with latex2sympy2==1.9.1 and antlr4-python3-runtime==4.7.2")
    parser.add_argument("--simplify-timeout", type=float, default=60.0, help="cap on LiveBench's 60 s simplify timeout")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--examples", type=int, default=4, help="disagreement examples shown per family")
    parser.add_argument("--cache", type=Path, default=None, help="a JSON file keeping LiveBench's verdicts")
    args = parser.parse_args(argv)

    SIMPLIFY_TIMEOUT[0] = args.simplify_timeout
    cache = VerdictCache(args.cache)
    rows = livebench_math_rows(args.data_dir)
    batches = _by_question(rows)
    tallies = {name: Tally() for name in FAMILIES}
    examples: dict[str, list[str]] = defaultdict(list)
    started = time.perf_counter()
    init = (args.livebench.resolve(), args.latex2sympy2, args.simplify_timeout, cache)
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(args.jobs, mp_context=context, initializer=_start_worker, initargs=init) as pool:
        for batch, results in zip(batches, pool.map(_score_question, batches)):
            for (row, label, answer), (key, theirs, ours) in zip(batch, results):
                cache.put(key, theirs)
                tally = tallies[family(row["subtask"])]
                tally.cases += 1
                if theirs in (JUDGE, _CUT):
                    tally.judge += 1
                    tally.cut += theirs == _CUT
                elif abs(ours - theirs) < 1e-9:
                    tally.agree += 1
                else:
                    examples[family(row["subtask"])].append(
                        f"  {row['question_id'][:8]} {row['subtask']} [{label}] LiveBench {theirs:.3f}, "
                        f"ours {ours:.3f}: {answer[-120:]!r}")
            cache.save()

    print(f"LiveBench checkout {args.livebench} (commit {_commit(args.livebench)}); latex2sympy2 fallback: "
          f"{'loaded' if args.latex2sympy2 else 'absent'}; simplify timeout {args.simplify_timeout:g} s; "
          f"{len(rows)} questions; {time.perf_counter() - started:.0f} s")
    print(f"| {'subtask':<9} | {'cases':>6} | {'needs judge':>11} | {'of which simplify cut':>21} "
          f"| {'agree':>6} | {'disagree':>8} | {'agreement':>9} |")
    print(f"|{'-' * 11}|{'-' * 8}|{'-' * 13}|{'-' * 23}|{'-' * 8}|{'-' * 10}|{'-' * 11}|")
    total = Tally()
    for t in tallies.values():
        total.cases, total.judge, total.cut, total.agree = (
            total.cases + t.cases, total.judge + t.judge, total.cut + t.cut, total.agree + t.agree)
    for name, t in [*tallies.items(), ("all", total)]:
        decided = t.cases - t.judge
        rate = f"{100 * t.agree / decided:.1f}%" if decided else "-"
        print(f"| {name:<9} | {t.cases:>6} | {t.judge:>11} | {t.cut:>21} | {t.agree:>6} | {t.disagree:>8} | {rate:>9} |")
    for name in FAMILIES:
        if examples[name]:
            print(f"\n{name}: {len(examples[name])} disagreements, e.g.")
            print("\n".join(examples[name][: args.examples]))
    return 0 if total.disagree == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
