"""dspy-pxn: DSPy's GEPA with P×N parallel proposals, one worker pool, and an exact budget.

The core is the optimizer at this package's top level (``teleprompter``, ``settings``, ``checks``, ``compat``,
``gepa_options``) and its rooms: ``engine`` (one compile: the run, the target protocol, the pooled
adapter, events, records, width, resume), ``schedules`` (gepa's step loop and the asynchronous
schedule), ``proposer`` (reflection, the sibling merge, selection), ``targets/program`` (a DSPy
program as what is optimized), ``ledger`` (calls, dollars, the budget) and ``pools``. Tooling lives
in the folders the core does not import: ``tracking`` (MLflow), ``targets/mlflow_prompts``,
``planning``, ``local`` (the embedded LM), ``testing`` (the synthetic task and simulated LM server)
and ``cli``. ARCHITECTURE.md follows one compile through them. Importing the package registers
MLflow as the tracker that BatchedGEPA's ``use_mlflow=True`` and friends build
(``dspy_pxn.engine.tracker``).
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
