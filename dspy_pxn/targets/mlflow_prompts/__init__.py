"""MLflow GenAI prompt optimization (``mlflow.genai.optimize_prompts``) support: a candidate evaluation
that many threads can run at once, in place of MLflow's eval_fn which patches ``PromptVersion`` per call."""

from dspy_pxn.targets.mlflow_prompts.evaluation import (
    ConcurrentEvaluation,
    MlflowInternalsChanged,
    mlflow_internals,
    self_test,
    serial_fallback_warning,
    template_override,
)

__all__ = [
    "ConcurrentEvaluation", "MlflowInternalsChanged", "mlflow_internals", "self_test", "serial_fallback_warning",
    "template_override",
]
