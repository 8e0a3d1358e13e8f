"""Where MLflow runs go: defaults, the mlflow install check, and names safe for a path."""

from __future__ import annotations

import importlib.util
import re
import sys

DEFAULT_EXPERIMENT = "dspy-pxn"
INSTALL_HINT = "pip install 'dspy-pxn[mlflow]' (or pip install 'mlflow>=3.4,<4')"


def require_mlflow(asked_by: str) -> None:
    if "mlflow" in sys.modules:
        return  # imported already (find_spec refuses a module object that has no spec)
    if importlib.util.find_spec("mlflow") is None:
        raise ImportError(f"{asked_by} needs the mlflow package, which is not installed: {INSTALL_HINT}.")


def default_tracking_uri() -> str:
    """What MLflow itself resolves: set_tracking_uri, MLFLOW_TRACKING_URI, else the local default store."""
    import mlflow

    return mlflow.get_tracking_uri()


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "run"
