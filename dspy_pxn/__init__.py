"""dspy-pxn: DSPy's GEPA with P×N parallel proposals, one worker pool, and an exact budget.

The core is the top level (``teleprompter``, ``settings``, ``checks``, ``compat``, ``gepa_options``) and ``engine``,
``schedules``, ``proposer``, ``targets/program``, ``ledger`` and ``pools``; the tooling (``tracking``, ``planning``,
``targets/mlflow_prompts``, ``local``, ``testing``, ``cli``) is what the core never imports (ARCHITECTURE.md). Importing
the package registers MLflow as the tracker ``use_mlflow=True`` and friends build (``dspy_pxn.engine.tracker``).
"""

import dspy_pxn.tracking  # noqa: F401 - registers the MLflow tracker for BatchedGEPA's shorthands
from dspy_pxn import compat
from dspy_pxn.engine.records import StepRecord, read_step_log
from dspy_pxn.engine.result import BatchedGEPAResult
from dspy_pxn.pools import ThreadWorkerPool, WorkerPool
from dspy_pxn.teleprompter import BatchedGEPA

compat.warn_if_untested("dspy")  # a newer DSPy or gepa than CI ran: one warning naming the tested range
compat.warn_if_untested("gepa")

__all__ = ["BatchedGEPA", "BatchedGEPAResult", "StepRecord", "ThreadWorkerPool", "WorkerPool", "read_step_log"]
__version__ = "0.2.0"
