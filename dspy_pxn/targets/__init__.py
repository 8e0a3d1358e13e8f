"""What a run optimizes, beside the engine: a DSPy program (``program``, ``BatchedGEPA``'s target), or MLflow prompt
templates (``mlflow_prompts``, ``BatchedGepaPromptOptimizer``'s; it needs the ``mlflow`` extra)."""
