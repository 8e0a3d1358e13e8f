"""Where MLflow runs go: defaults, the mlflow install check, and names safe for a path."""

from __future__ import annotations

import importlib.util
import os
import re
import sys

from dspy_pxn import compat

DEFAULT_EXPERIMENT = "dspy-pxn"
INSTALL_HINT = "pip install 'dspy-pxn[mlflow]' (or pip install 'mlflow>=3.13.0,<4')"


def mlflow_installed() -> bool:
    # imported already: find_spec refuses a module object that has no spec
    return "mlflow" in sys.modules or importlib.util.find_spec("mlflow") is not None


def require_mlflow(asked_by: str) -> None:
    """Tracking was asked for: refused before any work when MLflow is not installed, warned about when its
    version is outside the range CI ran."""
    if not mlflow_installed():
        raise ImportError(f"{asked_by} needs the mlflow package, which is not installed: {INSTALL_HINT}.")
    compat.warn_if_untested("mlflow")


def default_tracking_uri() -> str:
    """What MLflow itself resolves: set_tracking_uri, MLFLOW_TRACKING_URI, else the local default store."""
    import mlflow

    return mlflow.get_tracking_uri()


def default_experiment(tracking_uri: str) -> str:
    """MLflow's current experiment (``mlflow.set_experiment``, ``MLFLOW_EXPERIMENT_NAME`` or ``_ID``), else ours."""
    if os.environ.get("MLFLOW_EXPERIMENT_NAME"):
        return os.environ["MLFLOW_EXPERIMENT_NAME"]
    experiment_id = os.environ.get("MLFLOW_EXPERIMENT_ID")  # what mlflow.set_experiment(...) sets
    if experiment_id:
        from mlflow import MlflowClient

        from dspy_pxn.tracking.mlflow_io import probe

        if probe(tracking_uri) is not None:
            return DEFAULT_EXPERIMENT  # a server that is down: never wait out MLflow's retries for a name

        try:
            return MlflowClient(tracking_uri).get_experiment(experiment_id).name
        except Exception:  # noqa: BLE001 - an id from another store: ours, rather than a failed start
            return DEFAULT_EXPERIMENT
    return DEFAULT_EXPERIMENT


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "run"
