"""The constructor's former names, kept working for one release with a warning that names their replacement.

BatchedGEPA used to take two arguments for one thing: six MLflow shorthands beside ``tracker=``,
``max_reflection_cost_usd`` beside gepa's own ``max_reflection_cost``, ``callbacks`` and
``display_progress_bar`` beside ``gepa_kwargs``' (which dspy.GEPA users already pass), ``step_sinks``
beside the step hook every gepa callback may have (``on_step_record``), and ``testset`` in the
constructor where the data goes to ``compile``. ``renamed`` turns each into its one name.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

from dspy_pxn import checks
from dspy_pxn.records import StepRecord
from dspy_pxn.tracker import TrackingArguments, from_arguments

MLFLOW_SHORTHANDS = ("mlflow", "tracking_uri", "experiment", "run_name", "run_tags", "registered_model_name")
REPLACEMENTS = {
    "callbacks": "gepa_kwargs={'callbacks': [...]}",
    "display_progress_bar": "gepa_kwargs={'display_progress_bar': True}",
    "step_sinks": "a gepa callback with on_step_record(record), in gepa_kwargs={'callbacks': [...]}",
    "testset": "compile(..., testset=...)",
    "max_reflection_cost_usd": "gepa_kwargs={'max_reflection_cost': ...} (gepa's own name for it)",
    **{name: "tracker=dspy_pxn.tracking.MlflowTracker(tracking_uri=..., experiment=..., run_name=..., tags=..., "
             "registered_model_name=...), or tracker=False for no tracking" for name in MLFLOW_SHORTHANDS},
}


class StepSink:
    """A former ``step_sinks`` entry as the gepa callback that replaces it: it hears every StepRecord."""

    def __init__(self, sink: Callable[[StepRecord], None]):
        self.on_step_record = sink


def accepts_former_names(init: Callable[..., None]) -> Callable[..., None]:
    """``__init__`` with its former arguments translated (``renamed``); its signature stays the real one."""

    @functools.wraps(init)
    def translating(self: Any, *args: Any, **kwargs: Any) -> None:
        testset = kwargs.pop("testset", None)
        if testset is not None:
            warn("testset", stacklevel=3)
        init(self, *args, **renamed(kwargs))
        self.former_testset = checks.dataset("testset", testset) if testset is not None else None

    return translating


def warn(name: str, stacklevel: int = 4) -> None:
    """Once per former name given: it still works, and this is what to pass instead (shown at the caller's line)."""
    warnings.warn(f"BatchedGEPA({name}=...) is deprecated and will be removed in the next release: pass "
                  f"{REPLACEMENTS[name]}.", DeprecationWarning, stacklevel=stacklevel)


def renamed(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments with each former name replaced by its one name, and a DeprecationWarning per name."""
    former = [name for name in REPLACEMENTS if name in kwargs]
    if not former:
        return kwargs
    for name in former:
        warn(name)
    kwargs = dict(kwargs)
    gepa_kwargs = dict(kwargs.get("gepa_kwargs") or {})
    callbacks = [*gepa_kwargs.get("callbacks", ()), *kwargs.pop("callbacks", ()),
                 *map(StepSink, kwargs.pop("step_sinks", ()))]
    if callbacks:
        gepa_kwargs["callbacks"] = callbacks
    for name, gepa_name in (("display_progress_bar", "display_progress_bar"),
                            ("max_reflection_cost_usd", "max_reflection_cost")):
        if name in kwargs:
            if gepa_name in gepa_kwargs:
                raise ValueError(f"Pass {name}=... or gepa_kwargs={{'{gepa_name}': ...}}, not both: they are one thing.")
            value = kwargs.pop(name)
            if value is not None:
                gepa_kwargs[gepa_name] = value
    kwargs["gepa_kwargs"] = gepa_kwargs
    shorthands = {name: kwargs.pop(name) for name in MLFLOW_SHORTHANDS if name in kwargs}
    if shorthands:
        if kwargs.get("tracker") is not None:
            raise ValueError("tracker= and the MLflow shorthands (mlflow, tracking_uri, experiment, run_name, run_tags, "
                             "registered_model_name) are two trackers: pass one of them.")
        if kwargs.get("use_mlflow") and shorthands.get("mlflow") is not False:  # both said "MLflow": one tracker
            kwargs["use_mlflow"], shorthands["mlflow"] = False, True
        arguments = TrackingArguments(**shorthands)
        tracker = from_arguments(arguments)  # checks them (a contradiction fails here, before any LM call)
        kwargs["tracker"] = False if arguments.mlflow is False else tracker
    return kwargs
