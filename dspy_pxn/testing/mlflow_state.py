"""MLflow's process-wide state, put back after a block that sets it: for tests and benchmarks that point
MLflow at a temporary store.

``mlflow.set_tracking_uri`` and ``set_registry_uri`` set module globals *and* export environment variables
(so subprocesses inherit them), and reading the URIs back resolves defaults: restoring with the setters pins
the registry to whatever the default was, and a later ``MlflowTracker(tracking_uri=...)`` then registers
models in the wrong store. A LoggedModel made active by one block (``mlflow.set_active_model``, autolog) would
have the next block's metrics linked to a model its store does not hold.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME")


@contextmanager
def mlflow_state_restored() -> Iterator[None]:
    """The tracking and registry URIs as set (not as resolved), their environment variables and the active
    experiment, as they were before the block; no active model inside the block nor after it."""
    import mlflow
    from mlflow.tracking import fluent
    from mlflow.tracking._model_registry import utils as registry
    from mlflow.tracking._tracking_service import utils as tracking

    saved = tracking._tracking_uri, registry._registry_uri, fluent._active_experiment_id
    env = {name: os.environ.get(name) for name in ENV}
    mlflow.clear_active_model()
    try:
        yield
    finally:
        mlflow.clear_active_model()
        tracking._tracking_uri, registry._registry_uri, fluent._active_experiment_id = saved
        for name, value in env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
