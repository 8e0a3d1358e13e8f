"""The optimized program as an MLflow model of its run, and its instructions in the Prompt Registry.

What an MLflow user does after an optimization by hand, done for every tracked compile:
``mlflow.dspy.log_model`` (a LoggedModel whose source run is the compile's run, with a signature
and an input example), the seed's and the optimized program's scores as the model's metrics, the
run's params as the model's, and each predictor's instruction registered as a prompt version of
the run's experiment, linked to the run and the model. What differs from calling it by hand, each
for a reason:

- **It runs on the tracking writer thread, by explicit run id and experiment.** MLflow's active run
  and its "current experiment" are the caller's (thread-local, or process-wide), so the model is
  logged with ``mlflow.models.Model.log(run_id=...)`` and the DSPy flavor (what
  ``mlflow.dspy.log_model`` calls, minus the fluent run), under the DSPy settings the user compiled
  with (captured when the run started: the writer thread has none of the caller's ``dspy.context``);
  and the prompts are created, linked and filed under the run's experiment here, not through
  ``register_prompt``/``load_prompt``, which file a prompt under MLflow's current experiment (the
  Default one, for a run given ``experiment=``).
- **The signature is the program's, and logging calls no LM.** Its inputs are the program's input
  fields, its outputs its predictor's output fields (what it returns), not a valset example's labels;
  the input example is checked against that signature, not by MLflow's serving check, which loads
  the model and calls its LM (seconds, and a credentials warning for a model whose key is not in the
  environment).
- **No API key is serialized.** The DSPy flavor pickles the program and ``dspy.settings``;
  an LM built with ``api_key=...`` would put the key in the artifact store. The logged copy's
  LMs drop it, and the loaded model reads the provider's environment variable, as litellm does.
- **A copy stays in the log directory** (``model_source.pkl``), so a model the server did not
  take (down, or gone mid-upload) is logged later by ``dspy-pxn mlflow-import``.
"""

from __future__ import annotations

import inspect
import os
import re
import time
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import dspy

# The run's program model carries this tag (its value: the program's class), so a re-log or an import finds the
# run's own model whatever it is named.
PROGRAM_TAG = "dspy_pxn.program"
# Model.log links the run's metrics at the model's step to the model; no run metric is logged at this step,
# so the model's metrics are exactly its own (the seed's and the optimized program's scores).
MODEL_STEP = -1
MODEL_SOURCE_NAME = "model_source.pkl"
SCORE_TAG, RUN_TAG, PREDICTOR_TAG = "dspy_pxn.val_score", "dspy_pxn.run_id", "dspy_pxn.predictor"
_PROMPT_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_MODEL_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")  # a LoggedModel's name cannot hold / : . % " '


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
    # The LoggedModel's name: the run's task and setting (model_name()), so two runs' models tell apart in a list.
    # The default is the name of models logged before there was one (a model_source.pkl of an older version).
    model_name: str = "program"


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


def model_name(task: str, setting: str) -> str:
    """The LoggedModel's name, e.g. ``sim-4x4-merge-async``: a runs list or a model list then says which run's
    program each model is, where one name for every model left only the source-run column to tell them apart."""
    return _MODEL_NAME_UNSAFE.sub("-", f"{task}-{setting}").strip("-") or "program"


@dataclass(frozen=True)
class LoggedProgram:
    """What logging the program produced in MLflow."""

    model_id: str
    model_uri: str
    prompt_uris: tuple[str, ...]


def log_program(client: Any, run_id: str, source: ModelSource, val_score: float | None) -> LoggedProgram:
    """Register the instructions in the run's experiment, log the program as the run's model (its params the
    run's, its signature the program's, no LM called), link the prompts to the run and the model, give the
    model its metrics."""
    from mlflow.entities import Metric
    from mlflow.models import Model

    run = client.get_run(run_id)
    experiment_id = run.info.experiment_id
    options = source.options
    prompts = [register_instruction(client, prompt_name(options.prompt_prefix, predictor), text, run_id, val_score,
                                    experiment_id)
               for predictor, text in source.instructions().items() if text]
    # Created here, in the run's experiment: left to Model.log it lands in MLflow's *current* experiment.
    # Model.log gives the model it creates the run's params; so does this, for the page to show the setting.
    created = client.create_logged_model(
        experiment_id, name=options.model_name, source_run_id=run_id, model_type="agent",
        params=dict(run.data.params), tags={PROGRAM_TAG: type(source.program).__name__})
    signature = program_signature(source.program)
    with tracking_uri(client.tracking_uri), dspy.context(**source.settings):
        info = Model.log(
            artifact_path=None, name=options.model_name, flavor=DspyFlavorUnchecked, model=source.program,
            run_id=run_id, model_id=created.model_id, signature=signature,
            input_example=checked_input_example(options.input_example, signature), validate_serving_input=False,
            use_dspy_model_save=True, pip_requirements=_requirements(), step=MODEL_STEP,
        )
        # Linked here rather than through Model.log(prompts=...), which loads each prompt with load_prompt and so
        # files it under MLflow's current experiment too. The registry links through the global tracking URI.
        for prompt in prompts:
            client.link_prompt_version_to_run(run_id, prompt)
            client.link_prompt_version_to_model(prompt.name, str(prompt.version), info.model_id)
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


def register_instruction(client: Any, name: str, text: str, run_id: str, val_score: float | None,
                         experiment_id: str) -> Any:
    """The prompt version holding ``text`` (the latest one if it already does, else a new version), its prompt
    filed under ``experiment_id``.

    A text prompt: MLflow's chat format would show the instruction as a system message rendered as Markdown
    with no plain-text view, where a text prompt's page has one (see docs/guides/mlflow.md)."""
    predictor = name.rsplit(".", 1)[-1]
    if client.get_prompt(name) is None:
        try:
            client.create_prompt(name, description=f"The instruction of predictor {predictor!r}, as optimized by "
                                                   "dspy-pxn's BatchedGEPA")
        except Exception:
            if client.get_prompt(name) is None:  # not created meanwhile by another run: refused
                raise
    latest = _latest_version(client, name)
    if latest is None or latest.template != text:
        tags = {RUN_TAG: run_id, PREDICTOR_TAG: predictor}
        if val_score is not None:
            tags[SCORE_TAG] = f"{val_score:.6g}"
        message = f"BatchedGEPA run {run_id}" + (f": val {val_score:.4g}" if val_score is not None else "")
        latest = client.create_prompt_version(name, text, description=message, tags=tags)
    file_prompt_under(client, name, experiment_id)
    return latest


def _latest_version(client: Any, name: str) -> Any:
    """The prompt's latest version; None when it has none (a run that died between creating it and its version)."""
    try:
        return client.get_prompt_version(name, "latest")
    except Exception:  # noqa: BLE001 - MlflowException(RESOURCE_DOES_NOT_EXIST)
        return None


def file_prompt_under(client: Any, name: str, experiment_id: str) -> None:
    """Add ``experiment_id`` to the experiments a prompt is filed under (what an experiment's Prompts page lists).

    MLflow keeps them in one prompt tag, a comma-framed id list, and has no call that names the experiment: its
    own writers (``register_prompt``, ``load_prompt``) add MLflow's *current* experiment."""
    from mlflow.prompt.constants import PROMPT_EXPERIMENT_IDS_TAG_KEY

    prompt = client.get_prompt(name)
    filed = [i for i in (prompt.tags.get(PROMPT_EXPERIMENT_IDS_TAG_KEY) or "").split(",") if i.strip()]
    if experiment_id not in filed:
        client.set_prompt_tag(name, PROMPT_EXPERIMENT_IDS_TAG_KEY, "," + ",".join([*filed, experiment_id]) + ",")


# ----------------------------------------------------------------------------- signature and input example
_COLUMN_TYPES = {str: "string", int: "long", float: "double", bool: "boolean"}


def program_signature(program: Any) -> Any:
    """The model signature a program declares (None when it declares no inputs): inputs from the program's input
    fields, outputs from its predictor's output fields, which are what it returns. A program of several predictors
    returns what its ``forward`` builds, which no field declares: its signature has inputs only."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, Schema

    predictors = [predictor for _, predictor in program.named_predictors()]
    declared = {name: spec.annotation for predictor in predictors
                for name, spec in predictor.signature.input_fields.items()}
    inputs = _forward_inputs(program, declared)
    if inputs is None and len(predictors) == 1:  # forward(**kwargs): dspy.Predict, dspy.ChainOfThought, ...
        inputs = declared
    if not inputs:
        return None
    outputs = None
    if len(predictors) == 1:
        fields = predictors[0].signature.output_fields
        outputs = Schema([ColSpec(_column_type(spec.annotation), name) for name, spec in fields.items()])
    return ModelSignature(Schema([ColSpec(_column_type(kind), name) for name, kind in inputs.items()]), outputs)


def _forward_inputs(program: Any, declared: dict[str, Any]) -> dict[str, Any] | None:
    """The named parameters of the program's ``forward`` with their types (annotated, else the predictor field's of
    that name); None when it takes only ``**kwargs``. Read from the class: DSPy warns on ``program.forward``."""
    forward = type(program).forward
    try:
        parameters = list(inspect.signature(forward).parameters.values())[1:]  # after self
    except (TypeError, ValueError):
        return None
    named = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if not named:
        return None
    try:
        hints = typing.get_type_hints(forward)
    except Exception:  # noqa: BLE001 - annotations naming what this module cannot import: the fields' types
        hints = {}
    return {name: hints.get(name, declared.get(name)) for name in named}


def _column_type(annotation: Any) -> Any:
    """An MLflow column type for a field's annotation: str, int, float, bool and lists of them; anything else Any."""
    from mlflow.types.schema import AnyType, Array, DataType

    if annotation in _COLUMN_TYPES:
        return DataType[_COLUMN_TYPES[annotation]]
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation) or (None,)
        if item in _COLUMN_TYPES:
            return Array(DataType[_COLUMN_TYPES[item]])
    return AnyType()


def checked_input_example(example: dict[str, Any] | None, signature: Any) -> dict[str, Any] | None:
    """A valset example's inputs as the model's input example, checked against the signature without calling the
    model (``mlflow.models.validate_schema``); None where they do not fit it, or there is no signature (MLflow would
    infer one by calling the model, i.e. its LM)."""
    if not example or signature is None:
        return None
    from mlflow.models import validate_schema

    names = signature.inputs.input_names()
    if not set(names) <= set(example):
        return None
    candidate = {name: example[name] for name in names}
    try:
        validate_schema(candidate, signature.inputs)
    except Exception:  # noqa: BLE001 - MlflowException: an example the schema does not take is not the model's
        return None
    return candidate


class DspyFlavorUnchecked:
    """``mlflow.dspy`` as ``Model.log`` calls it (``flavor.save_model``), for ``validate_serving_input=False``.

    MLflow checks an input example by loading the model and calling it, which calls the program's LM: seconds
    after the search, an LM call outside its budget, and a credentials warning when the key is not in the
    environment. ``Model.log`` skips the check for ``validate_serving_input=False`` but hands that keyword on to
    the flavor, and ``mlflow.dspy.save_model`` takes none; this drops it. The example is checked against the
    signature instead (``checked_input_example``)."""

    __name__ = "mlflow.dspy"

    @staticmethod
    def save_model(validate_serving_input: bool = True, **kwargs: Any) -> None:
        import mlflow.dspy

        mlflow.dspy.save_model(**kwargs)


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


def model_of(client: Any, run_id: str) -> str | None:
    """The id of the program model a run already logged (None: none yet), so logging it again is skipped."""
    run = client.get_run(run_id)
    outputs = getattr(run, "outputs", None)
    for output in getattr(outputs, "model_outputs", None) or []:
        model = client.get_logged_model(output.model_id)
        if PROGRAM_TAG in model.tags and "READY" in str(model.status):  # not one a failed upload left behind
            return model.model_id
    return None
