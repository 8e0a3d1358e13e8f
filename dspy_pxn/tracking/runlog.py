"""The run's own record on disk, which MLflow only mirrors.

A tracked run writes ``run.json`` (who it is, where it goes, its params, the seed
baseline and the final numbers) next to ``steps.jsonl`` and ``proposals.jsonl`` in
its log directory before MLflow hears of any of it. If the tracking server is down
or dies mid-run, this directory still holds the whole run, and
``dspy_pxn.tracking.import_step_log`` replays it into MLflow later.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from dspy_pxn.engine.records import BillByRole

MANIFEST_NAME = "run.json"
PROGRAM_NAME = "program.json"
PROPOSALS_TABLE = "proposals.csv"
CANDIDATES_TABLE = "candidates.csv"
PLOTS_DIR = "plots"

RUNNING, FINISHED, FAILED = "RUNNING", "FINISHED", "FAILED"
SUMMARY = "totals"  # the MLflow metric prefix of a run's totals (its run page section)


@dataclass
class Baseline:
    """The seed program's validation, which every curve starts from (MLflow step 0)."""

    val_score: float
    metric_calls: int
    elapsed_s: float
    cost_usd: float | None = None


# The step records' counts whose run totals are logged beside the step series (the run overview shows a series'
# last step, which reads like a total: ``search/proposals 1``); the failures only when something failed.
BILL_BY_ROLE = frozenset(f.name for f in fields(BillByRole))
COUNTED = ("proposals", "improved", "accepted", "rollouts")
FAILURES = ("reflection_failures", "rollout_failures", "lm_retries", "lm_failures")


@dataclass
class FinalMetrics(BillByRole):
    """The run's totals. ``wall_s`` and ``cost_usd`` cover the search, not the test evaluation; the counts of
    ``COUNTED`` and ``FAILURES`` are the step records' sums (None, 0: a manifest written before they were kept)."""

    best_val: float
    metric_calls: int
    iterations: int
    validation_trigger_fraction: float
    candidates: int
    wall_s: float
    lm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    test_score: float | None = None
    proposals: int | None = None
    improved: int | None = None
    accepted: int | None = None
    rollouts: int | None = None
    reflection_failures: int = 0
    rollout_failures: int = 0
    lm_retries: int = 0
    lm_failures: int = 0

    @property
    def val_test_gap(self) -> float | None:
        return None if self.test_score is None else self.best_val - self.test_score

    def metrics(self) -> dict[str, float]:
        """The totals, logged once at the end in the run page's ``totals`` section; unknown values are
        left out, not logged as 0, and so are failures that did not happen."""
        values = {
            "best_val": self.best_val,
            "metric_calls": self.metric_calls,
            "iterations": self.iterations,
            "validation_trigger_fraction": self.validation_trigger_fraction,
            "candidates": self.candidates,
            "wall_s": self.wall_s,
            "lm_calls": self.lm_calls,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_usd": self.cost_usd,
            **{f"{role}_{name}": getattr(self, f"{role}_{name}") for role in ("task", "reflection")
               for name in ("lm_calls", "prompt_tokens", "completion_tokens", "cost_usd")},
            "test_score": self.test_score,
            "val_test_gap": self.val_test_gap,
            **{name: getattr(self, name) for name in COUNTED},
            **{name: count for name in FAILURES if (count := getattr(self, name))},
        }
        return {f"{SUMMARY}/{name}": float(value) for name, value in values.items() if value is not None}


@dataclass
class RunManifest:
    """Identity and outcome of one run (``kind="run"``) or of a sweep's parent (``kind="sweep"``)."""

    kind: str
    run_name: str
    experiment: str
    tracking_uri: str
    started_at: float
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    run_id: str | None = None
    parent_run_id: str | None = None
    status: str = RUNNING
    baseline: Baseline | None = None
    final: FinalMetrics | None = None

    def save(self, log_dir: str) -> None:
        os.makedirs(log_dir, exist_ok=True)
        path = os.path.join(log_dir, MANIFEST_NAME)
        with open(path + ".tmp", "w") as handle:
            json.dump(asdict(self), handle, indent=2, sort_keys=True)
        os.replace(path + ".tmp", path)  # a reader never sees half a manifest

    @classmethod
    def load(cls, log_dir: str) -> RunManifest | None:
        path = os.path.join(log_dir, MANIFEST_NAME)
        if not os.path.exists(path):
            return None
        with open(path) as handle:
            data = json.load(handle)
        known = {f.name for f in fields(cls)}
        data = {key: value for key, value in data.items() if key in known}
        if data.get("baseline"):
            data["baseline"] = Baseline(**data["baseline"])
        if data.get("final"):
            final_fields = {f.name for f in fields(FinalMetrics)}
            data["final"] = FinalMetrics(**{k: v for k, v in data["final"].items() if k in final_fields})
        return cls(**data)


def read_table(path: str) -> dict[str, list[Any]]:
    """A table written by ``write_table``, by column (what ``MlflowClient.log_table`` takes): numbers as
    numbers, empty cells as None, texts, lists and dicts as the text the CSV holds."""
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        columns: dict[str, list[Any]] = {name: [] for name in reader.fieldnames or []}
        for row in reader:
            for name, cells in columns.items():
                cells.append(_cell(row[name]))
    return columns


def _cell(text: str) -> Any:
    if text == "":
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, (int, float)) else text


def write_table(path: str, rows: Sequence[Any]) -> None:
    """Dataclass rows to CSV; list and dict cells as JSON so the file stays one row per record."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    records = [asdict(row) for row in rows]
    # A record's own fields first, then the bill by role it inherits (dataclasses list a base's fields first).
    columns = sorted((f.name for f in fields(rows[0])), key=lambda name: name in BILL_BY_ROLE) if rows else []
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for record in records:
            writer.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in record.items()})
