"""Score the optimized program on a held-out test set, after the search, on the run's pool.

Run comparisons report a val−test gap, so the test score is computed as the validation scores are (same metric,
failure scoring and pool), but only once the search has ended: the optimizer never sees a test example. Not with
``dspy.Evaluate``: under ``mlflow.dspy.autolog(log_evals=True)`` that call opens an MLflow run of its own, an orphan
beside the tracked run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import dspy
from dspy.primitives import Example

from dspy_pxn.checks import score_of
from dspy_pxn.pools import WorkerPool
from dspy_pxn.targets.program.components import code_components
from dspy_pxn.targets.program.rollout import run_rollout


def holdout_score(program: dspy.Module, examples: Sequence[Example], metric: Callable[..., Any], pool: WorkerPool,
                  failure_score: float = 0.0) -> float:
    """Mean metric score of ``program`` over ``examples`` (failures score ``failure_score``)."""
    code = bool(code_components(program))
    results = pool.map(lambda example: run_rollout(program, example, metric, False, failure_score, code), list(examples))
    # Every rollout's score is checked (rollout.run_rollout): a number, or a Prediction with one.
    return sum(float(score_of(result.score)) for result in results) / len(results)
