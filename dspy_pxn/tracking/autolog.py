"""A compile under ``mlflow.dspy.autolog()``: one run of ours, and no trace per rollout.

Autolog makes DSPy trace every module and LM call, and wraps ``Teleprompter.compile`` of the
optimizers it knows so that compiling traces nothing (``log_traces_from_compile=False``, its
default): a GEPA search is thousands of rollouts. It patches only the direct subclasses of
``Teleprompter`` (``dspy.GEPA`` among them), so ``BatchedGEPA.compile`` is not wrapped; this
module gives it the same rule. With ``log_compiles=True`` autolog logs each compile it wraps
as a run; for BatchedGEPA that run is ours (as if ``use_mlflow=True`` were given), nested under
the caller's active run if there is one, so a compile never yields two unrelated runs.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

FLAVOR = "dspy"


def _config(key: str) -> Any:
    """An autolog setting for DSPy, or None when mlflow is not imported or DSPy autolog is off."""
    if "mlflow" not in sys.modules:
        return None
    import dspy

    try:
        from mlflow.dspy.callback import MlflowCallback
        from mlflow.utils.autologging_utils import autologging_is_disabled, get_autologging_config
    except ImportError:  # a module named mlflow that is not MLflow (a stand-in, a partial install): no autolog
        return None

    if autologging_is_disabled(FLAVOR) or not any(isinstance(c, MlflowCallback) for c in dspy.settings.callbacks):
        return None
    return get_autologging_config(FLAVOR, key, None)


def logs_compiles() -> bool:
    """``mlflow.dspy.autolog(log_compiles=True)`` is on: the user asked for every compile as a run."""
    return bool(_config("log_compiles"))


@contextmanager
def no_compile_traces() -> Iterator[None]:
    """Tracing off while a compile runs under autolog, unless ``log_traces_from_compile=True``."""
    if _config("log_traces_from_compile") is not False:  # None: autolog is off; True: the user wants them
        yield
        return
    import mlflow
    from mlflow.tracing.provider import is_tracing_enabled

    if not is_tracing_enabled():
        yield
        return
    mlflow.tracing.disable()
    try:
        yield
    finally:
        mlflow.tracing.enable()
