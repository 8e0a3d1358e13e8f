"""The tasks the command line optimizes: each one's program, feedback metric and data, by name.

Every check here runs before any LM call, so a mistake costs the user a second, not a
started model or a bill.
"""

from __future__ import annotations

import argparse
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dspy_pxn.cli.errors import UsageError
from dspy_pxn.engine.width import AUTO

TASKS = ("math", "hover", "gsm8k", "sim")  # sim: the synthetic task on a simulated LM, no key, no network


@dataclass
class Task:
    """A task's program, GEPA feedback metric and (train, val, test) examples, ready to compile."""

    name: str
    program: Any
    metric: Callable[..., Any]
    train: list[Any]
    val: list[Any]
    test: list[Any]


def _subsample(examples: list[Any], size: int | None, seed: int) -> list[Any]:
    """The first-drawn ``size`` examples of a fixed seeded shuffle, in their original order."""
    if size is None or size >= len(examples):
        return list(examples)
    keep = sorted(random.Random(seed).sample(range(len(examples)), size))
    return [examples[i] for i in keep]


def _check_data_dir(data_dir: str | None) -> None:
    if data_dir is not None and not os.path.isdir(data_dir):
        raise UsageError(f"--data-dir {data_dir!r} is not a directory; point it at the folder holding "
                         "livebench_math/, hover/ and gsm8k/ (or set DSPY_PXN_DATA_DIR).")


def _data_error(task: str, error: Exception) -> UsageError:
    if isinstance(error, ModuleNotFoundError):  # a core install: the programs' own dependencies are an extra
        return UsageError(f"{task} needs the 'programs' extra ({error}): pip install 'dspy-pxn[programs]'.")
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    for library_words, flag in (("data_dir=PATH", "--data-dir PATH"), ("online=True", "--online")):
        first = first.replace(library_words, flag)  # the loaders speak Python; this user typed flags
    return UsageError(f"{task}: {first}")


def load_task(args: argparse.Namespace) -> Task:
    """Build the task's program and data, turning missing files into one-line usage errors."""
    if args.task not in TASKS:
        raise UsageError(f"unknown task {args.task!r}: choose one of {', '.join(TASKS)}.")
    if args.task == "hover" and not args.corpus:
        raise UsageError("hover needs --corpus PATH: a JSONL file of {\"title\", \"text\"} passages, e.g. the "
                         "2017 Wikipedia abstracts (python -m dspy_pxn.programs.retrieval download --dest DIR).")
    _check_data_dir(args.data_dir)
    try:
        program, metric, (train, val, test) = _TASK_LOADERS[args.task](args)
    except (FileNotFoundError, ImportError) as error:
        raise _data_error(args.task, error) from None
    sizes = (args.train_size, args.val_size, args.test_size)
    train, val, test = (_subsample(part, size, args.seed) for part, size in zip((train, val, test), sizes))
    return Task(args.task, program, metric, train, val, test)


def _load_math(args: argparse.Namespace):
    from dspy_pxn.programs.math_solver import MathSolver, load_livebench_math, metric

    return MathSolver(), metric, load_livebench_math(args.data_dir, online=args.online)


def _load_hover(args: argparse.Namespace):
    from dspy_pxn.programs.hover import HoverAgent, load_hover, metric
    from dspy_pxn.programs.retrieval import open_index

    if not os.path.isfile(args.corpus):
        raise UsageError(f"--corpus {args.corpus!r} is not a file; pass a JSONL file of {{\"title\", \"text\"}} lines.")
    return HoverAgent(open_index(corpus=args.corpus)), metric, load_hover(args.data_dir, online=args.online)


def _load_gsm8k(args: argparse.Namespace):
    from dspy_pxn.programs.gsm8k import GSM8KSolver, load_gsm8k, metric

    sizes = {"n_train": args.train_size or 200, "n_val": args.val_size or 50, "n_test": args.test_size or 200}
    return GSM8KSolver(), metric, load_gsm8k(args.data_dir, online=args.online, seed=args.seed, **sizes)


def _load_sim(args: argparse.Namespace):
    from dspy_pxn import testing as sim

    sizes = {"train": args.train_size or 60, "val": args.val_size or 30, "test": args.test_size or 100}
    return sim.seed_program(), sim.metric, sim.make_splits(seed=args.seed, **sizes)


_TASK_LOADERS: dict[str, Callable[[argparse.Namespace], tuple]] = {
    "math": _load_math, "hover": _load_hover, "gsm8k": _load_gsm8k, "sim": _load_sim,
}


def parents_flag(text: str) -> int | str:
    """``--p``: a number of parents, or ``auto`` (the width follows --workers, within the budget)."""
    if text == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a number of parents (e.g. 4) nor 'auto'") from None


def check_shape(args: argparse.Namespace) -> None:
    """Bad P, N, W or budget: say which and how, before data or models load."""
    for flag, value in (("--p", args.p), ("--n", args.n), ("--workers", args.workers), ("--budget", args.budget)):
        if value is not None and value != AUTO and value < 1:
            raise UsageError(f"{flag} {value} must be a positive integer (P×N = parents × mutations per step, "
                             "e.g. --p 2 --n 2).")
