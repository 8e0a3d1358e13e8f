"""MLflow tracking for BatchedGEPA runs: one MLflow run per compile (its program logged as the
run's model, its instructions in the Prompt Registry), sweeps as nested runs, a log directory
replayed into MLflow later, and runs compared side by side.

The optimizer never imports this package: it is handed a tracker (``MlflowTracker``) or
builds one from its convenience arguments through the factory registered below.

    BatchedGEPA(..., use_mlflow=True)                        # MLflow's tracking URI, the dspy-pxn experiment
    BatchedGEPA(..., tracker=MlflowTracker(experiment="hover"))
    with sweep("pxn-grid", experiment="hover"): ...          # every run inside is a nested child
    import_step_log("runs/4x2")                              # replay a log directory
    compare_experiment("hover", "comparison/")               # plots and table (dspy_pxn.tracking.compare)
"""

from dspy_pxn.engine.tracker import register_around_compile, register_default_tracker
from dspy_pxn.tracking.autolog import no_compile_traces
from dspy_pxn.tracking.importer import ImportedRun, import_step_log
from dspy_pxn.tracking.mlflow_io import BEST_RUN_TAG, CONFIG_TAG, KIND_TAG, MODEL_TAG, PARENT_TAG, SWEEP_TAG
from dspy_pxn.tracking.mlflow_run import MlflowRun, MlflowTracker
from dspy_pxn.tracking.parent import Sweep, current_sweep
from dspy_pxn.tracking.sweep import sweep

register_default_tracker(MlflowTracker.by_default)
register_around_compile(no_compile_traces)  # under mlflow.dspy.autolog(): no trace per rollout



def __getattr__(name: str) -> object:
    """``BatchedGepaPromptOptimizer`` on first use: it subclasses MLflow's GenAI optimizer base, whose import
    (``mlflow.genai``) a DSPy-only user never pays for."""
    if name == "BatchedGepaPromptOptimizer":
        from dspy_pxn.targets.mlflow_prompts.optimizer import BatchedGepaPromptOptimizer

        return BatchedGepaPromptOptimizer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BatchedGepaPromptOptimizer", "BEST_RUN_TAG", "CONFIG_TAG", "KIND_TAG", "MODEL_TAG", "PARENT_TAG", "SWEEP_TAG", "ImportedRun", "MlflowRun",
    "MlflowTracker", "Sweep", "current_sweep", "import_step_log", "sweep",
]
