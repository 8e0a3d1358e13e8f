"""Argument checks that run before any LM call, each naming the argument and the fix.

dspy.GEPA reports most of these as bare ``AssertionError``s, or not at all (a metric
that cannot be called with three arguments silently scores every example 0).

Bad input, decided per case (tests/reliability/test_bad_input.py):

==========================================  =================================================
metric raises on an example                 per rollout: warning names the example and the
                                            error; scored failure_score; no trajectory
metric returns None / NaN / inf / a string  per rollout: warning names the example and the
(or a Prediction whose .score is one)       value; scored failure_score (gepa would crash on
                                            a string, or carry NaN into every aggregate)
metric returns a finite score outside       kept (other reward scales are legitimate); one
[0, 1] (bools are numbers)                  warning per metric to set perfect_score
program raises on some inputs               per rollout: warning names the example and error
examples missing the program's inputs       ValueError up front naming set[index], the
                                            missing fields and ``.with_inputs(...)``
track_best_outputs with log_dir (program    gepa's state is saved with cloudpickle (plain
outputs in gepa's pickled state)            pickle fails on dspy.Predictions); ValueError up
                                            front when cloudpickle is missing
log_dir not writable                        ValueError up front naming log_dir and the fix
==========================================  =================================================
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import math
import os
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import dspy

logger = logging.getLogger(__name__)


class ArgumentError(ValueError, AssertionError):
    """A bad argument that dspy.GEPA reports with a bare ``assert``.

    It is a ValueError naming the argument and the fix, and also an AssertionError, so
    code written for dspy.GEPA (``except AssertionError``) keeps catching it.
    """


def positive_int(name: str, value: Any, hint: str = "", *, or_none: bool = False) -> Any:
    """``value`` when it is an int >= 1 (or None, with ``or_none``); else a ValueError naming it."""
    if or_none and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        kinds = "an int >= 1 or None" if or_none else "an int >= 1"
        raise ValueError(f"{name} must be {kinds}, got {name}={value!r}.{(' ' + hint) if hint else ''}")
    return value


def positive_number(name: str, value: Any, hint: str = "") -> float | None:
    """None, or a finite number above 0 (a budget in dollars or seconds)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ArgumentError(f"{name} must be a number above 0 or None, got {value!r}. {hint}".strip())
    return float(value)


def at_most_one_budget(auto: str | None, max_full_evals: int | None, max_metric_calls: int | None) -> None:
    """None given is allowed (the run then uses auto='light'); two are a contradiction."""
    given = {
        name: value
        for name, value in (("auto", auto), ("max_full_evals", max_full_evals), ("max_metric_calls", max_metric_calls))
        if value is not None
    }
    if len(given) > 1:
        raise ArgumentError(
            "Set one budget: max_metric_calls=<int>, max_full_evals=<int>, or auto='light'|'medium'|'heavy'"
            f" (got {given}); with none, the run uses auto='light'."
        )
    if auto is not None and auto not in ("light", "medium", "heavy"):
        raise ValueError(f"auto must be 'light', 'medium' or 'heavy', got {auto!r}.")
    if max_full_evals is not None:
        positive_int("max_full_evals", max_full_evals)
    if max_metric_calls is not None:
        positive_int("max_metric_calls", max_metric_calls)


def dataset(name: str, examples: Sequence[Any] | None) -> list[dspy.Example]:
    if examples is None or len(examples) == 0:
        raise ArgumentError(f"{name} must be a non-empty list of dspy.Example, got {examples!r}.")
    for index, example in enumerate(examples):
        if not isinstance(example, dspy.Example):
            raise TypeError(f"{name}[{index}] must be a dspy.Example, got {type(example).__name__}.")
        try:
            inputs = example.inputs()
        except ValueError:
            raise ValueError(
                f"{name}[{index}] has no input fields declared; build it with dspy.Example(...).with_inputs('question')."
            ) from None
        if len(inputs.keys()) == 0:
            raise ValueError(f"{name}[{index}] declares no input fields; call .with_inputs(...) with its input keys.")
    return list(examples)


def program(student: Any, components: Sequence[str]) -> None:
    if not isinstance(student, dspy.Module):
        raise TypeError(f"student must be a dspy.Module, got {type(student).__name__}.")
    if not components:
        raise ValueError(
            "student has nothing to optimize: GEPA rewrites the instructions of dspy.Predict (or "
            "ChainOfThought, ...) modules inside the program, and the code of dspy.Flex modules."
        )


def budget_buys_one_step(max_metric_calls: int, valset_size: int, minibatch_size: int, smallest: int) -> None:
    """A budget that cannot pay for one step would validate the seed and return it unchanged."""
    if max_metric_calls < smallest:
        raise ValueError(
            f"A budget of {max_metric_calls} metric calls cannot pay for one optimization step: the seed's "
            f"validation costs {valset_size} (|valset|), and one proposal costs {2 * minibatch_size} to screen "
            f"(parent and child on reflection_minibatch_size={minibatch_size} examples) plus {valset_size} to "
            f"validate. The smallest budget that buys one step is {smallest}: raise max_metric_calls to at least "
            f"{smallest}, or use a smaller valset or reflection_minibatch_size."
        )


# ----------------------------------------------------------------------------- bad input (see the module docstring)
_warned_out_of_range: set[int] = set()


def describe_example(example: Any, limit: int = 120) -> str:
    """The example's inputs, short enough for a log line."""
    try:
        text = ", ".join(f"{key}={value!r}" for key, value in example.inputs().items())
    except Exception:  # noqa: BLE001 - describing must never fail a rollout
        text = repr(example)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_warned_metric_problems: dict[str, weakref.WeakSet] = {}


def warn_once_per_metric(metric: Any, kind: str, message: str, *args: Any) -> None:
    """Warn about a metric's first failure of each kind; later ones go to debug.

    Every such rollout still scores ``failure_score`` and counts in its step's
    ``rollout_failures``; a metric that fails on every seed rollout stops the run
    (``adapter.metric_fails_everywhere``), so one line per kind is enough to see it.
    """
    warned = _warned_metric_problems.setdefault(kind, weakref.WeakSet())
    try:
        if metric in warned:
            logger.debug(message, *args)
            return
        warned.add(metric)
    except TypeError:  # a callable that takes no weak reference: warn every time
        pass
    logger.warning(message + " (Further such rollouts are logged at debug level and counted in rollout_failures.)",
                   *args)


def score_of(outcome: Any) -> Any:
    """A GEPA metric's score: the number it returned, or the ``score`` of the dspy.Prediction it returned."""
    return outcome["score"] if hasattr(outcome, "score") else outcome


def metric_score_problem(outcome: Any, metric: Any = None) -> str | None:
    """Why a metric's return value cannot be a GEPA score, or None when it can.

    Accepted: a real number or bool, or an object with ``.score`` (dspy.Prediction(score=...,
    feedback=...)) holding one. Refused: None, NaN/inf, strings and other types — gepa would
    add them up deep in its state (a string) or carry NaN into every aggregate.
    """
    score = score_of(outcome)
    hint = "return a float, or dspy.Prediction(score=<float>, feedback=<str>)"
    if score is None:
        return f"returned no score (None); {hint}"
    if isinstance(score, bool):
        return None
    if not isinstance(score, (int, float)):
        return f"returned {type(score).__name__} {score!r:.60} instead of a number; {hint}"
    if not math.isfinite(score):
        return f"returned {score!r}, not a finite number; {hint}"
    if not 0.0 <= score <= 1.0 and id(metric) not in _warned_out_of_range:
        _warned_out_of_range.add(id(metric))
        logger.warning(
            "Metric returned %r, outside [0, 1]: kept as is (once per metric). skip_perfect_score compares "
            "scores to perfect_score (default 1.0); set perfect_score to your metric's maximum.", score,
        )
    return None


def examples_match_program(student: Any, **datasets: Sequence[Any]) -> None:
    """Every example provides the inputs the program's forward needs (checked before any LM call).

    A module whose ``forward`` names its parameters is checked by binding the example's inputs;
    a Predict/ChainOfThought (``forward(**kwargs)``) by its signature's input fields.
    """
    required, bind = _program_inputs(student)
    for name, examples in datasets.items():
        for index, example in enumerate(examples or ()):
            inputs = dict(example.inputs())
            problem = None
            if bind is not None:
                try:
                    bind(**inputs)
                except TypeError as error:
                    problem = str(error)
            elif required:
                missing = sorted(set(required) - set(inputs))
                if missing:
                    problem = f"missing input field(s) {missing}"
            if problem is not None:
                raise ValueError(
                    f"{name}[{index}] does not match the program's inputs ({problem}): it declares inputs "
                    f"{sorted(inputs)}; the program needs {sorted(required) if required else 'other arguments'}. "
                    "Build examples with dspy.Example(...).with_inputs(<the program's input fields>)."
                )


def _program_inputs(student: Any) -> tuple[list[str], Callable[..., Any] | None]:
    try:
        # object.__getattribute__: DSPy warns on any `module.forward` access outside __call__.
        signature = inspect.signature(object.__getattribute__(student, "forward"))
    except (TypeError, ValueError):
        return [], None
    params = list(signature.parameters.values())
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        return names, signature.bind
    predictors = student.named_predictors()
    if len(predictors) == 1:  # Predict, ChainOfThought, ...: the inputs are the signature's
        return list(predictors[0][1].signature.input_fields), None
    return [], None


def wandb_installed() -> None:
    """use_wandb hands the run to gepa's Weights & Biases logging, which needs the wandb package."""
    if importlib.util.find_spec("wandb") is None:
        raise ImportError(
            "use_wandb=True needs the wandb package, which gepa logs to: pip install wandb. Or track the run "
            "in MLflow instead, with no extra service: use_mlflow=True."
        )


def writable_dir(name: str, path: str | None) -> None:
    """Create ``path`` if needed and prove a file can be written there, before any LM call."""
    if path is None:
        return
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name} must be a directory path (str), got {type(path).__name__}.")
    probe = os.path.join(path, f".dspy_pxn_write_probe_{os.getpid()}")
    try:
        os.makedirs(path, exist_ok=True)
        with open(probe, "w") as handle:
            handle.write("ok")
        os.remove(probe)
    except OSError as error:
        raise ValueError(
            f"{name}={os.fspath(path)!r} is not a writable directory ({type(error).__name__}: {error.strerror or error}). "
            f"Pass a directory you can write to, or {name}=None to keep no run files."
        ) from None


def saved_state_serializable(log_dir: str | None, track_best_outputs: bool, gepa_kwargs: dict[str, Any]) -> None:
    """gepa pickles its state into log_dir after every step; with track_best_outputs the state holds
    dspy.Predictions, whose dynamic signature classes standard pickle cannot serialize (gepa raises
    after the seed validation has been paid for). Use cloudpickle for them, or refuse up front."""
    if log_dir is None or not track_best_outputs or "use_cloudpickle" in gepa_kwargs:
        return
    try:
        import cloudpickle  # noqa: F401
    except ImportError:
        raise ValueError(
            "track_best_outputs=True with log_dir needs cloudpickle to save the program outputs in gepa's state: "
            "pip install cloudpickle, or set track_best_outputs=False, or log_dir=None."
        ) from None
    gepa_kwargs["use_cloudpickle"] = True


def schedule(schedule: str, *, use_merge: bool, use_wandb: bool, loop_only: Sequence[str] = ()) -> str:
    """'steps' (gepa's loop, one P×N step at a time) or 'async' (P·N proposals always in flight)."""
    if schedule not in ("steps", "async"):
        raise ValueError(f"schedule={schedule!r} is not understood: use 'steps' (gepa's step loop) or 'async' "
                         "(P·N proposals always in flight, no step barrier).")
    if schedule == "async" and use_merge:
        raise ValueError("use_merge=True (gepa's crossover merge) runs inside gepa's step loop: with schedule='async' "
                         "use selection='merge' (the improving children merged into one candidate) instead.")
    if schedule == "async" and loop_only:
        raise ValueError(f"gepa_kwargs {list(loop_only)} are read by gepa's step loop, which schedule='async' does "
                         "not run: use schedule='steps' with them, or drop them.")
    if schedule == "async" and use_wandb:
        raise ValueError("use_wandb=True logs from inside gepa's step loop, which schedule='async' does not run: "
                         "use use_mlflow=True, or schedule='steps'.")
    return schedule


_warned_no_timeout: set[int] = set()


def warn_if_no_timeout(role: str, lm: Any) -> None:
    """Warn once per LM object when a dspy.LM has no ``timeout``: a hung request then holds a worker for up to
    600 s per attempt on DSPy's native engine (its read timeout) and 6000 s on litellm's. Warned, not fixed: a
    copy of the LM with a timeout would change its DSPy cache keys."""
    if not isinstance(lm, dspy.LM) or lm.kwargs.get("timeout") is not None or id(lm) in _warned_no_timeout:
        return
    _warned_no_timeout.add(id(lm))
    logger.warning(
        "The %s LM %s has no timeout: a hung request holds a worker for up to 600 s per attempt on DSPy's native "
        "engine (6000 s with engine='litellm'). Pass dspy.LM(..., timeout=60) (300-600 s for a slow reflection "
        "model).", role, lm.model,
    )
