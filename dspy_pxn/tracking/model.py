"""The optimized program as an MLflow model of its run, and its instructions in the Prompt Registry.

What an MLflow user does after an optimization by hand, done for every tracked compile:
``mlflow.dspy.log_model`` (a LoggedModel whose source run is the compile's run, with an input
example from the valset and a signature), the seed's and the optimized program's scores as the
model's metrics, and each predictor's instruction registered as a prompt version linked to the
model. Three things differ from calling it by hand, each for a reason:

- **It runs on the tracking writer thread, by explicit run id.** MLflow's active run is
  thread-local, so the model is logged with ``mlflow.models.Model.log(run_id=...)`` and the
  DSPy flavor (what ``mlflow.dspy.log_model`` calls, minus the fluent run), under the DSPy
  settings the user compiled with (captured when the run started: the writer thread has
  none of the caller's ``dspy.context``).
- **No API key is serialized.** The DSPy flavor pickles the program and ``dspy.settings``;
  an LM built with ``api_key=...`` would put the key in the artifact store. The logged copy's
  LMs drop it, and the loaded model reads the provider's environment variable, as litellm does.
- **A copy stays in the log directory** (``model_source.pkl``), so a model the server did not
  take (down, or gone mid-upload) is logged later by ``dspy-pxn mlflow-import``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import dspy

MODEL_NAME = "program"  # the LoggedModel's name within its run
# Model.log links the run's metrics at the model's step to the model; no run metric is logged at this step,
# so the model's metrics are exactly its own (the seed's and the optimized program's scores).
MODEL_STEP = -1
MODEL_SOURCE_NAME = "model_source.pkl"
SCORE_TAG, RUN_TAG, PREDICTOR_TAG = "dspy_pxn.val_score", "dspy_pxn.run_id", "dspy_pxn.predictor"
_PROMPT_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def check_registered_model_name(name: str | None) -> None:
    """Refuse, before any search, a registry name MLflow would refuse only when the run ends."""
    if name is None:
        return
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"registered_model_name must be a non-empty string, got {name!r}, "
                         "e.g. registered_model_name='hover-agent'.")
    if set(name) & set("/:"):
        raise ValueError(f"registered_model_name={name!r}: MLflow model names cannot contain '/' or ':'; "
                         "use e.g. 'hover-agent'.")


@dataclass(frozen=True)
class ModelOptions:
    """How a run's program is logged: decided when the run starts."""

    prompt_prefix: str  # prompts are named <prompt_prefix>.<predictor>
    registered_model_name: str | None = None
    input_example: dict[str, Any] | None = None  # a valset example's inputs
    output_example: dict[str, Any] | None = None  # and its labels, for the signature's outputs


@dataclass
class ModelSource:
    """What logging the optimized program needs, captured in the caller's thread; picklable."""

    program: Any  # a copy of the optimized program whose LMs hold no API key
    settings: dict[str, Any]  # the DSPy settings the program answers under (its LM), keys dropped
    options: ModelOptions
    # The model's own metrics: the seed's and the optimized program's scores. Unprefixed, so on the run page
    # they are the "Model metrics" section, apart from the search's sections.
    metrics: dict[str, float] = field(default_factory=dict)

    def instructions(self) -> dict[str, str]:
        """Each predictor's instruction in the optimized program, by predictor name."""
        return {name: predictor.signature.instructions for name, predictor in self.program.named_predictors()}

    def save(self, log_dir: str) -> None:
        with open(os.path.join(log_dir, MODEL_SOURCE_NAME), "wb") as handle:
            cloudpickle.dump(self, handle)

    @classmethod
    def load(cls, log_dir: str) -> ModelSource | None:
        path = os.path.join(log_dir, MODEL_SOURCE_NAME)
        if not os.path.exists(path):
            return None
        with open(path, "rb") as handle:
            return cloudpickle.load(handle)


def caller_settings() -> dict[str, Any]:
    """The DSPy settings of this thread as the user set them, minus the run's trace and API keys."""
    settings = {key: value for key, value in dspy.settings.config.items() if key not in ("trace", "usage_tracker")}
    if settings.get("lm") is not None:
        settings["lm"] = without_api_key(settings["lm"])
    return settings


def without_api_key(lm: Any) -> Any:
    """A copy of an LM whose kwargs hold no ``api_key`` (the LM itself, when it holds none)."""
    kwargs = getattr(lm, "kwargs", None)
    if not isinstance(kwargs, dict) or "api_key" not in kwargs:
        return lm
    scrubbed = lm.copy()
    scrubbed.kwargs.pop("api_key", None)
    return scrubbed


def model_source(program: Any, settings: dict[str, Any], options: ModelOptions, results: Any) -> ModelSource:
    """The optimized program, keys dropped, with the example, scores and names it is logged with."""
    copy = program.deepcopy()
    vars(copy).pop("detailed_results", None)  # every candidate of the search, with their LMs: not the model
    for _, predictor in copy.named_predictors():
        if getattr(predictor, "lm", None) is not None:
            predictor.lm = without_api_key(predictor.lm)
    metrics: dict[str, float] = {}
    if results is not None:
        scores = results.val_aggregate_scores
        metrics = {"val_score": float(scores[results.best_idx]), "seed_val_score": float(scores[0])}
        if results.test_score is not None:
            metrics["test_score"] = float(results.test_score)
    return ModelSource(copy, settings, options, metrics)


def prompt_name(prefix: str, predictor: str) -> str:
    """A registry name for a predictor's instruction: ``<prefix>.<predictor>``, in the characters MLflow allows."""
    return _PROMPT_NAME_UNSAFE.sub("-", f"{prefix}.{predictor}").strip("-.") or "dspy-pxn-prompt"


def default_prompt_prefix(experiment: str, program: str) -> str:
    """Stable across re-runs of one program in one experiment, so a re-run adds versions, not prompts."""
    return f"{experiment}.{program}"


@dataclass(frozen=True)
class LoggedProgram:
    """What logging the program produced in MLflow."""

    model_id: str
    model_uri: str
    prompt_uris: tuple[str, ...]


def log_program(client: Any, run_id: str, source: ModelSource, val_score: float | None) -> LoggedProgram:
    """Register the instructions, log the program as the run's model (linked to them), give it its metrics."""
    import mlflow
    from mlflow.entities import Metric
    from mlflow.models import Model

    prefix = source.options.prompt_prefix
    prompts = [register_instruction(client, prompt_name(prefix, predictor), text, run_id, val_score)
               for predictor, text in source.instructions().items() if text]
    # Created here, in the run's experiment: left to Model.log it lands in MLflow's *current* experiment.
    created = client.create_logged_model(client.get_run(run_id).info.experiment_id, name=MODEL_NAME,
                                         source_run_id=run_id, model_type="agent")
    with tracking_uri(client.tracking_uri), active_model_kept(), dspy.context(**source.settings):
        info = Model.log(
            artifact_path=None, name=MODEL_NAME, flavor=mlflow.dspy, model=source.program, run_id=run_id,
            model_id=created.model_id,
            input_example=source.options.input_example, signature=_signature(source.options),
            prompts=[p.uri for p in prompts] or None, use_dspy_model_save=True, pip_requirements=_requirements(),
            step=MODEL_STEP,
        )
    if source.metrics:
        stamp = int(time.time() * 1000)
        client.log_batch(run_id, metrics=[Metric(key, value, stamp, MODEL_STEP, model_id=info.model_id)
                                          for key, value in source.metrics.items()])
    return LoggedProgram(info.model_id, f"models:/{info.model_id}", tuple(p.uri for p in prompts))


def register_model(client: Any, name: str, model_uri: str, run_id: str) -> str:
    """A new version of registered model ``name`` for a logged model (the registered model made if new).

    The registry resolves ``models:/<id>`` through MLflow's global tracking URI, so it points at the run's."""
    with tracking_uri(client.tracking_uri):
        try:
            client.get_registered_model(name)
        except Exception:  # noqa: BLE001 - RESOURCE_DOES_NOT_EXIST
            client.create_registered_model(name)
        version = client.create_model_version(name, source=model_uri, run_id=run_id,
                                              model_id=model_uri.removeprefix("models:/"))
    return str(version.version)


def register_instruction(client: Any, name: str, text: str, run_id: str, val_score: float | None) -> Any:
    """The prompt version holding ``text``: the latest one if it already does, else a new version."""
    latest = _latest_version(client, name)
    if latest is not None and latest.template == text:
        return latest
    tags = {RUN_TAG: run_id, PREDICTOR_TAG: name.rsplit(".", 1)[-1]}
    if val_score is not None:
        tags[SCORE_TAG] = f"{val_score:.6g}"
    message = f"BatchedGEPA run {run_id}" + (f": val {val_score:.4g}" if val_score is not None else "")
    return client.register_prompt(name=name, template=text, commit_message=message, tags=tags)


def _latest_version(client: Any, name: str) -> Any:
    try:
        return client.load_prompt(f"prompts:/{name}@latest")
    except Exception:  # noqa: BLE001 - MlflowException(RESOURCE_DOES_NOT_EXIST): no such prompt yet
        return None


def _signature(options: ModelOptions) -> Any:
    """Inputs from a valset example, outputs from its labels; None lets MLflow infer it by calling the model."""
    if not options.input_example:
        return None
    from mlflow.models import infer_signature

    try:
        return infer_signature(options.input_example, options.output_example or None)
    except Exception:  # noqa: BLE001 - an input MLflow's schema cannot describe: let MLflow infer
        return None


def _requirements() -> list[str]:
    """What loading the model needs. Named, not inferred: MLflow infers by loading the model in a
    subprocess, seconds per compile."""
    from importlib.metadata import version

    return [f"dspy=={version('dspy')}", f"mlflow=={version('mlflow')}"]


@contextmanager
def tracking_uri(uri: str) -> Iterator[None]:
    """``Model.log`` and the registry follow MLflow's global tracking URI: point it at this run's, then back."""
    import mlflow
    from mlflow.tracking._tracking_service import utils as tracking_service

    if mlflow.get_tracking_uri() == uri:
        yield
        return
    # The global as it was (None when unset), not what it resolved to: restoring the resolved URI would pin
    # it and hide a later change of MLFLOW_TRACKING_URI from every MLflow call in this process.
    before, environment = tracking_service._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(before)  # which also sets or unsets MLFLOW_TRACKING_URI: put the user's back
        if environment is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = environment


@contextmanager
def active_model_kept() -> Iterator[None]:
    """Model.log loads the model to check its input example, which makes it this thread's *active model*:
    every metric this thread logs afterwards, to any run, would be linked to it. Put back what was active."""
    import mlflow

    before = mlflow.get_active_model_id()
    try:
        yield
    finally:
        if mlflow.get_active_model_id() != before:
            if before is None:
                mlflow.clear_active_model()
            else:
                mlflow.set_active_model(model_id=before)


def model_of(client: Any, run_id: str) -> str | None:
    """The id of the program model a run already logged (None: none yet), so logging it again is skipped."""
    run = client.get_run(run_id)
    outputs = getattr(run, "outputs", None)
    for output in getattr(outputs, "model_outputs", None) or []:
        model = client.get_logged_model(output.model_id)
        if model.name == MODEL_NAME and "READY" in str(model.status):  # not one a failed upload left behind
            return model.model_id
    return None

