"""Argument checks that run before any LM call, each naming the argument and the fix.

dspy.GEPA reports most of these as bare ``AssertionError``s, or not at all (a metric
that cannot be called with three arguments silently scores every example 0). No check
refuses what dspy.GEPA runs: a check that cannot be sure warns and lets the run go on;
only input that would fail under dspy.GEPA too fails here, early.

Bad input, decided per case (tests/reliability/test_bad_input.py):

==========================================  =================================================
metric raises on an example                 per rollout: warning names the example and the
                                            error; scored failure_score; no trajectory
metric returns a real number (a float,      kept, converted to a float once (numpy scalars
int, bool, np.float32, np.bool_, ...)       such as np.isclose's np.bool_ too)
metric returns None / NaN / inf / a string  per rollout: warning names the example and the
(or a Prediction whose .score is one)       value; scored failure_score (gepa would crash on
                                            a string, or carry NaN into every aggregate)
metric returns a finite score outside       kept (other reward scales are legitimate); one
[0, 1] (bools are numbers)                  warning per metric to set perfect_score
program raises on some inputs               per rollout: warning names the example and error
program raises on nearly every seed         the program's own exception, after the seed's
validation example                          validation, naming the example and where
examples missing what ``forward`` names     ValueError up front naming set[index], the
(a forward without ``**kwargs``)            missing fields and ``.with_inputs(...)``
examples missing a Predict's input fields   one warning (DSPy's Predict warns and runs too)
a budget too small for one step             one warning naming the smallest budget that buys
                                            one; the run validates the seed and returns it
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
import numbers
import os
import weakref
from collections.abc import Sequence
from typing import Any

import dspy

logger = logging.getLogger(__name__)


class ArgumentError(ValueError, AssertionError):
    """A bad argument that dspy.GEPA reports with a bare ``assert``: a ValueError naming the argument and the fix,
    and also an AssertionError, so code written for dspy.GEPA (``except AssertionError``) keeps catching it."""


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
    named = (("auto", auto), ("max_full_evals", max_full_evals), ("max_metric_calls", max_metric_calls))
    given = {name: value for name, value in named if value is not None}
    if len(given) > 1:
        raise ArgumentError("Set one budget: max_metric_calls=<int>, max_full_evals=<int>, or "
                            f"auto='light'|'medium'|'heavy' (got {given}); with none, the run uses auto='light'.")
    if auto is not None and auto not in ("light", "medium", "heavy"):
        raise ValueError(f"auto must be 'light', 'medium' or 'heavy', got {auto!r}.")
    for name, value in named[1:]:  # the two numeric budgets
        if value is not None:
            positive_int(name, value)


def dataset(name: str, examples: Sequence[Any] | None) -> list[dspy.Example]:
    if examples is None or len(examples) == 0:
        raise ArgumentError(f"{name} must be a non-empty list of dspy.Example, got {examples!r}.")
    for index, example in enumerate(examples):
        if not isinstance(example, dspy.Example):
            raise TypeError(f"{name}[{index}] must be a dspy.Example, got {type(example).__name__}.")
        try:
            inputs = example.inputs()
        except ValueError:
            raise ValueError(f"{name}[{index}] has no input fields declared; build it with "
                             "dspy.Example(...).with_inputs('question').") from None
        if len(inputs.keys()) == 0:
            raise ValueError(f"{name}[{index}] declares no input fields; call .with_inputs(...) with its input keys.")
    return list(examples)


def program(student: Any, components: Sequence[str]) -> None:
    if not isinstance(student, dspy.Module):
        raise TypeError(f"student must be a dspy.Module, got {type(student).__name__}.")
    if not components:
        raise ValueError("student has nothing to optimize: GEPA rewrites the instructions of dspy.Predict (or "
                         "ChainOfThought, ...) modules inside the program, and the code of dspy.Flex modules.")


class BudgetBuysNoValidation(Exception):
    """The budget cannot pay for the seed's validation: the compile returns the program unchanged."""


def budget_buys_one_step(max_metric_calls: int, valset_size: int, fewest_rows: int, smallest: int) -> None:
    """Say so when the budget cannot pay for one step, which dspy.GEPA overspends it to make; the run still runs,
    never over budget (``BudgetBuysNoValidation``: not even the seed's validation). ``fewest_rows``: the examples the
    cheapest proposal is screened on (``BudgetGuard.fewest_rows``); ``smallest``: the budget that buys one step."""
    if max_metric_calls < valset_size:
        raise BudgetBuysNoValidation(
            f"A budget of {max_metric_calls} metric calls cannot pay for the seed's validation ({valset_size} "
            f"calls, |valset|): the program is returned unchanged, with no LM call and no detailed_results. The "
            f"smallest budget that buys one optimization step is {smallest}.")
    if max_metric_calls < smallest:
        logger.warning(
            "A budget of %d metric calls cannot pay for one optimization step: the seed's validation costs %d "
            "(|valset|), and one proposal costs at least %d to screen (parent and child on %d training example(s) "
            "each) plus %d to validate. The run validates the seed and returns it, never over budget "
            "(dspy.GEPA would overspend it to make one step). The smallest budget that buys one step is %d: raise "
            "max_metric_calls to at least %d, or use a smaller valset or reflection_minibatch_size.",
            max_metric_calls, valset_size, 2 * fewest_rows, fewest_rows, valset_size, smallest, smallest)


# ----------------------------------------------------------------------------- bad input (see the module docstring)
_warned_out_of_range: set[int] = set()


def describe_example(example: Any, limit: int = 120) -> str:
    try:
        text = ", ".join(f"{key}={value!r}" for key, value in example.inputs().items())
    except Exception:  # noqa: BLE001 - describing must never fail a rollout
        text = repr(example)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_warned_metric_problems: dict[str, weakref.WeakSet] = {}


def warn_once_per_metric(metric: Any, kind: str, message: str, *args: Any) -> None:
    """Warn about a metric's first failure of each kind; later ones go to debug: every such rollout still scores
    ``failure_score`` and counts in its step's ``rollout_failures``, and a metric that fails on every seed rollout
    stops the run (``adapter.metric_fails_everywhere``), so one line per kind is enough to see it."""
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
    """A GEPA metric's score: the number it returned, or the ``score`` of the object (a dspy.Prediction) it returned."""
    return getattr(outcome, "score", outcome)


def real_number(value: Any) -> float | None:
    """``value`` as a float when it is a real number, else None.

    Real numbers are what dspy.GEPA adds up: Python's (``numbers.Real``, bools) and the scalars
    of array libraries (``np.float32``, ``np.int64``, ``np.bool_`` from ``np.isclose``, a 0-d
    array or tensor), which convert with ``float()``. Text never does, even when it would parse.
    """
    if isinstance(value, (bool, numbers.Real)):
        return float(value)
    if value is None or isinstance(value, (str, bytes, complex)) or getattr(value, "shape", ()) != ():
        return None
    try:
        return float(value)
    except (TypeError, ValueError, ArithmeticError):
        return None


def scored(outcome: Any, metric: Any = None) -> tuple[Any, str | None]:
    """A metric's return value (a real number, or a dspy.Prediction that keeps its feedback and objective scores)
    with its score converted to a float once, and None; or None and why it has no score. None, NaN/inf, text and
    other types are refused (the rollout then scores ``failure_score``): gepa would add them up deep in its state
    (text) or carry NaN into every aggregate."""
    raw = score_of(outcome)
    hint = "return a float, or dspy.Prediction(score=<float>, feedback=<str>)"
    if raw is None:
        return None, f"returned no score (None); {hint}"
    score = real_number(raw)
    if score is None:
        return None, f"returned {type(raw).__name__} {raw!r:.60} instead of a number; {hint}"
    if not math.isfinite(score):
        return None, f"returned {raw!r}, not a finite number; {hint}"
    if not 0.0 <= score <= 1.0 and id(metric) not in _warned_out_of_range:
        _warned_out_of_range.add(id(metric))
        logger.warning("Metric returned %r, outside [0, 1]: kept as is (once per metric). skip_perfect_score "
                       "compares scores to perfect_score (default 1.0); set perfect_score to your metric's maximum.",
                       score)
    if isinstance(outcome, dspy.Prediction):  # its feedback and objective scores go on with it
        outcome["score"] = score
        return outcome, None
    return score, None


def examples_match_program(student: Any, **datasets: Sequence[Any]) -> None:
    """Every example gives the program's ``forward`` what it names (checked before any LM call).

    Only what dspy.GEPA would fail on too is refused: a ``forward`` that names its parameters (no
    ``**kwargs``) is called with each example's inputs, so an example that cannot bind to it fails every
    rollout. A ``forward`` that takes ``**kwargs`` (a program that renames its inputs, a decorator without
    ``functools.wraps``) or whose signature cannot be read is not guessed at. DSPy's ``Predict`` warns and
    runs without one of its signature's input fields: for a student that is a predictor, so does this check.
    """
    forward, warned = _forward_signature(student), False
    for name, examples in datasets.items():
        for index, example in enumerate(examples or ()):
            inputs = dict(example.inputs())
            if forward is not None:
                try:
                    forward.bind(**inputs)
                except TypeError as error:
                    raise ValueError(f"{name}[{index}] does not match the program's forward{forward} ({error}): it "
                                     f"declares inputs {sorted(inputs)}. Build examples with "
                                     "dspy.Example(...).with_inputs(<the names forward takes>).") from None
            elif not warned and (missing := _missing_predictor_inputs(student, inputs)):
                warned = True
                logger.warning("%s[%d] declares inputs %s, without %s that %s's signature reads; the run goes on "
                               "as DSPy's Predict does (it warns and leaves them out of the prompt). Build examples "
                               "with dspy.Example(...).with_inputs(...) naming them.", name, index, sorted(inputs),
                               missing, type(student).__name__)


def _forward_signature(student: Any) -> inspect.Signature | None:
    """None when ``forward`` takes ``**kwargs`` or its signature cannot be read."""
    try:
        # object.__getattribute__: DSPy warns on any `module.forward` access outside __call__.
        signature = inspect.signature(object.__getattribute__(student, "forward"))
    except (AttributeError, TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()):
        return None
    return signature


def _missing_predictor_inputs(student: Any, inputs: dict[str, Any]) -> list[str]:
    """The input fields a student that is itself a DSPy predictor reads and the example lacks."""
    predictor = student if isinstance(student, dspy.Predict) else getattr(student, "predict", None)
    if not isinstance(student, (dspy.Predict, dspy.ChainOfThought)) or not isinstance(predictor, dspy.Predict):
        return []
    return sorted(set(predictor.signature.input_fields) - set(inputs))


def wandb_installed() -> None:
    """use_wandb hands the run to gepa's Weights & Biases logging, which needs the wandb package."""
    if importlib.util.find_spec("wandb") is None:
        raise ImportError("use_wandb=True needs the wandb package, which gepa logs to: pip install wandb. Or track "
                          "the run in MLflow instead, with no extra service: use_mlflow=True.")


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
        raise ValueError(f"{name}={os.fspath(path)!r} is not a writable directory ({type(error).__name__}: "
                         f"{error.strerror or error}). Pass a directory you can write to, or {name}=None to keep no "
                         "run files.") from None


def saved_state_serializable(log_dir: str | None, track_best_outputs: bool, gepa_kwargs: dict[str, Any]
                             ) -> dict[str, Any]:
    """gepa's arguments, with cloudpickle for its saved state where it must be: gepa pickles its state into
    log_dir after every step, and with track_best_outputs the state holds dspy.Predictions, whose dynamic
    signature classes standard pickle cannot serialize (gepa raises after the seed validation has been
    paid for). Refused up front when cloudpickle is missing."""
    if log_dir is None or not track_best_outputs or "use_cloudpickle" in gepa_kwargs:
        return gepa_kwargs
    try:
        import cloudpickle  # noqa: F401
    except ImportError:
        raise ValueError("track_best_outputs=True with log_dir needs cloudpickle to save the program outputs in "
                         "gepa's state: pip install cloudpickle, or set track_best_outputs=False, or log_dir=None."
                         ) from None
    return {**gepa_kwargs, "use_cloudpickle": True}


def loop_only_gepa_kwargs(gepa_kwargs: dict[str, Any]) -> list[str]:
    """The gepa_kwargs only gepa's step loop reads (the asynchronous schedule reads ``use_cloudpickle`` and
    ``merge_val_overlap_floor`` too)."""
    return sorted(set(gepa_kwargs) - {"use_cloudpickle", "merge_val_overlap_floor"})


def schedule(schedule: str, *, use_wandb: bool, loop_only: Sequence[str] = ()) -> str:
    """'steps' (gepa's loop, one P×N step at a time) or 'async' (P·N proposals always in flight)."""
    if schedule not in ("steps", "async"):
        raise ValueError(f"schedule={schedule!r} is not understood: use 'steps' (gepa's step loop) or 'async' "
                         "(P·N proposals always in flight, no step barrier).")
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
    logger.warning("The %s LM %s has no timeout: a hung request holds a worker for up to 600 s per attempt on "
                   "DSPy's native engine (6000 s with engine='litellm'). Pass dspy.LM(..., timeout=60) (300-600 s "
                   "for a slow reflection model).", role, lm.model)
