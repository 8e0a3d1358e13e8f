"""The tests' one way to compile: ``compile_sim`` builds the optimizer, enters the task LM's context and compiles.

Its defaults are the simulated task's (``dspy_pxn.testing``): the seed program, ``sim.metric``, 24 training and
8 validation examples (seed 0), a fresh ``sim.SimulatedLM()`` as the reflection LM, and a pool of 8 workers.
Everything else is the optimizer's own keyword arguments, passed through as given.

    program, results = compile_sim(p=2, n=2, max_metric_calls=60, lm=sim.SimulatedLM())
    results = compile_sim(splits=splits, schedule="async", max_metric_calls=200).results  # the caller's LM
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import dspy
from dspy.teleprompt import Teleprompter

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim

# The splits a compile takes when none are given: small enough for a few steps, large enough for several.
SPLITS = {"seed": 0, "train": 24, "val": 8, "test": 8}
NUM_THREADS = 8


class Compiled(NamedTuple):
    """The compiled program and its ``detailed_results`` (None when the optimizer tracked no stats)."""

    program: dspy.Module
    results: Any


def reflection_prompts(reflection_lm: Any) -> list[str]:
    """The user message of each of DSPy's reflection prompts the LM answered (not the sibling merges)."""
    return [h["messages"][-1]["content"] for h in reflection_lm.history if "new_instruction" in str(h["messages"])]


def compile_sim(
    program: dspy.Module | None = None,
    splits: Sequence[Any] | None = None,
    *,
    lm: dspy.BaseLM | None = None,
    reflection_lm: dspy.BaseLM | None = None,
    metric: Callable[..., Any] | None = sim.metric,
    testset: list[dspy.Example] | None = None,
    optimizer: type[Teleprompter] | Teleprompter = BatchedGEPA,
    context: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Compiled:
    """Compile ``program`` (default: ``sim.seed_program()``) with ``optimizer(metric, reflection_lm, **kwargs)``.

    Args:
        splits: ``(train, val[, test])``, e.g. ``sim.make_splits(...)`` or the ``splits`` fixture; only train and
            val are used (a val of None compiles on the trainset alone). Default: ``sim.make_splits(**SPLITS)``.
        lm: The task LM, entered with ``dspy.context`` for the compile alone. Default: the caller's context's
            (e.g. the ``task_lm`` fixture's).
        reflection_lm: Default: a fresh ``sim.SimulatedLM()``.
        metric: Default ``sim.metric``; None is the program's own (``program.metric``).
        testset: Passed to ``compile`` when given (``detailed_results.test_score``).
        optimizer: ``BatchedGEPA`` (default) or ``dspy.GEPA``: the class is called with the same arguments. Or an
            optimizer already built (e.g. to catch its constructor's warnings): it is used as it is, and neither
            ``metric``, ``reflection_lm`` nor ``kwargs`` may be given.
        context: More ``dspy.context`` settings for the compile (e.g. an adapter).
        **kwargs: The optimizer's own arguments; ``num_threads`` defaults to ``NUM_THREADS``.
    """
    train, val, *_ = splits if splits is not None else sim.make_splits(**SPLITS)
    if isinstance(optimizer, type):
        kwargs.setdefault("num_threads", NUM_THREADS)
        teleprompter = optimizer(metric=metric, reflection_lm=reflection_lm if reflection_lm is not None
                                 else sim.SimulatedLM(), **kwargs)
    else:
        assert metric is sim.metric and reflection_lm is None and not kwargs, "the optimizer is built already"
        teleprompter = optimizer
    settings = {**({"lm": lm} if lm is not None else {}), **(context or {})}
    data = {"trainset": train, "valset": val, **({"testset": testset} if testset is not None else {})}
    with dspy.context(**settings) if settings else contextlib.nullcontext():
        compiled = teleprompter.compile(program if program is not None else sim.seed_program(), **data)
    return Compiled(compiled, getattr(compiled, "detailed_results", None))
