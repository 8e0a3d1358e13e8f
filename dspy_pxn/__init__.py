"""dspy-pxn: DSPy's GEPA with P×N parallel proposals, one worker pool, and an exact budget."""

from dspy_pxn.pool import ThreadWorkerPool, WorkerPool
from dspy_pxn.steps import StepRecord, read_step_log
from dspy_pxn.teleprompter import BatchedGEPA, BatchedGEPAResult

__all__ = ["BatchedGEPA", "BatchedGEPAResult", "StepRecord", "ThreadWorkerPool", "WorkerPool", "read_step_log"]
__version__ = "0.1.0"
