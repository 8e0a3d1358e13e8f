"""What a prompt optimization logs to its MLflow run, from one thread, as MLflow's GEPA optimizer logs it.

MLflow's own optimizer logs each full validation of a candidate as ``prompt_candidates/iteration_<k>/``
(``eval_results.json``, a table of the rows; ``scores.json``; one ``<prompt>.txt`` per template) and the
metric ``eval_score`` (and ``eval_score.<scorer>``) at step k. The same is logged here, plus each step's
measurements (``StepRecord``: scores, metric calls, widths, waits) under dspy-pxn's metric names. The
engine validates candidates on many threads at once; every MLflow call goes through one background
writer thread, in order, by explicit run id (the optimization's run is the caller thread's active run).
"""

from __future__ import annotations

import json
import logging
import tempfile
import threading
from pathlib import Path
from typing import Any

from dspy_pxn.engine.records import StepRecord
from dspy_pxn.tracking.mlflow_io import BackgroundWriter, MlflowMirror

logger = logging.getLogger(__name__)

PROMPT_CANDIDATES_DIR = "prompt_candidates"  # MLflow's GEPA optimizer's names
EVAL_RESULTS_FILE = "eval_results.json"
SCORES_FILE = "scores.json"
FLUSH_TIMEOUT_S = 120.0


class PromptRunLog:
    """Logs candidates and steps to one MLflow run; ``close()`` waits for what is queued."""

    def __init__(self, run_id: str, tracking_uri: str, started_at: float):
        self.run_id, self.started_at = run_id, started_at
        self.mirror = MlflowMirror(tracking_uri)
        self.writer = BackgroundWriter(tracking_uri, on_failure=self._failed)
        self._iterations = 0
        self._lock = threading.Lock()
        self._failing: set[str] = set()

    def _failed(self, reason: str) -> None:
        logger.warning("Logging the prompt optimization to MLflow run %s stopped: %s. The optimization goes on.",
                       self.run_id, reason)

    def validated(self, candidate: dict[str, str], records: list[Any]) -> None:
        """A candidate's full validation: ``prompt_candidates/iteration_<k>`` and ``eval_score`` at step k."""
        with self._lock:
            iteration = self._iterations
            self._iterations += 1
        self.writer.submit(lambda: self._log_candidate(iteration, dict(candidate), records))

    def on_step_record(self, record: StepRecord) -> None:
        self.writer.submit(lambda: self.mirror.log_step(self.run_id, record, self.started_at, self._failing))

    def close(self) -> None:
        if not self.writer.close(FLUSH_TIMEOUT_S):
            logger.warning("MLflow logging of the prompt optimization did not finish within %.0f s.", FLUSH_TIMEOUT_S)

    def _log_candidate(self, iteration: int, candidate: dict[str, str], records: list[Any]) -> None:
        client, directory = self.mirror.client, f"{PROMPT_CANDIDATES_DIR}/iteration_{iteration}"
        scorers = sorted({name for record in records for name in (record.individual_scores or {})})
        table = {"inputs": [r.inputs for r in records], "output": [r.outputs for r in records],
                 "expectation": [r.expectations for r in records], "aggregate_score": [r.score for r in records]}
        for name in scorers:
            table[name] = [(r.individual_scores or {}).get(name) for r in records]
        client.log_table(self.run_id, data=table, artifact_file=f"{directory}/{EVAL_RESULTS_FILE}")
        scored = [r.score for r in records if r.score is not None]
        aggregate = sum(scored) / len(scored) if scored else 0.0
        per_scorer = {}
        for name in scorers:
            values = [r.individual_scores[name] for r in records if name in (r.individual_scores or {})]
            if values:
                per_scorer[name] = sum(values) / len(values)
        self.mirror.log_metrics(self.run_id, {"eval_score": aggregate}
                                | {f"eval_score.{name}": value for name, value in per_scorer.items()}, step=iteration)
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / SCORES_FILE).write_text(json.dumps({"aggregate": aggregate, "per_scorer": per_scorer},
                                                            indent=2))
            client.log_artifact(self.run_id, str(Path(tmp) / SCORES_FILE), artifact_path=directory)
            for name, text in candidate.items():
                (Path(tmp) / f"{name}.txt").write_text(text)
                client.log_artifact(self.run_id, str(Path(tmp) / f"{name}.txt"), artifact_path=directory)
