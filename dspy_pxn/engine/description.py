"""A compile, described once: what tracking logs as its parameters and what a resume must match.

Tracking (MLflow params, the comparison's "same setup" check) and resume (refusing to continue a run under other
settings) both need to say what a run *is*: each compile writes one ``RunDescription`` (``dspy_pxn.engine.run``),
and each reads its own view of it (``params``, ``label``; ``resume_settings``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from dspy.primitives import Example


def digest(items: Sequence[Any]) -> str:
    """Order-sensitive fingerprint of examples or texts (reordering a set changes the run too)."""
    hasher = hashlib.sha256()
    for item in items:
        text = json.dumps(dict(item.toDict()), sort_keys=True, default=str) if isinstance(item, Example) else str(item)
        hasher.update(text.encode() + b"\0")
    return hasher.hexdigest()[:16]


def lm_name(lm: Any) -> str:
    """The model string only: an LM's kwargs hold api_key and api_base, which are never logged."""
    return "none" if lm is None else str(getattr(lm, "model", None) or type(lm).__name__)


def lm_identity(lm: Any) -> str:
    """Which model answers, and where: ``model @ endpoint``, never a key nor credentials in a URL. The endpoint is
    the LM's ``api_base``/``base_url``, else litellm's ``<PROVIDER>_API_BASE`` environment variable (where litellm
    sends the call when none is given)."""
    if lm is None:
        return "none"
    model = lm_name(lm)
    kwargs = getattr(lm, "kwargs", None) or {}
    provider = model.split("/", 1)[0].upper() if "/" in model else "OPENAI"
    endpoint = kwargs.get("api_base") or kwargs.get("base_url") or os.environ.get(f"{provider}_API_BASE")
    if not endpoint:
        return model
    parts = urlsplit(str(endpoint))
    host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    return f"{model} @ {urlunsplit((parts.scheme, host, parts.path, '', ''))}"


@dataclass(frozen=True)
class RunDescription:
    """What one compile is: its P×N step, budget, pool, program, data and LMs."""

    p: int
    n: int
    selection: str  # dspy_pxn.proposer.selection.label
    schedule: str  # "steps" | "async"
    minibatch_size: int
    seed: int | None
    crossover: bool  # gepa's crossover merge (use_merge=True), not the sibling merge (selection="merge")
    candidate_selection: str
    budget: int
    num_workers: int
    program: str
    predictors: int
    code_components: int
    dataset: str
    trainset_size: int
    valset_size: int
    testset_size: int
    task_lms: tuple[Any, ...]  # the LM objects themselves: names for params, identities for resume
    reflection_lm: Any  # None: a custom instruction proposer reflects
    trainset_digest: str
    valset_digest: str
    seed_candidate_digest: str
    # One valset example's inputs, for a tracker that logs the program as a model (its input example).
    input_example: dict[str, Any] | None = None
    # The budgets in dollars and seconds, when given (dspy_pxn.ledger.caps); like the budget, a resume may change them.
    caps: dict[str, float] = field(default_factory=dict)


def label(description: RunDescription) -> str:
    """How runs are named and compared: '4x4', '16x1 best', '8x2 top-2', '4x4 merge async'."""
    d = description
    return (f"{d.p}x{d.n}" + ("" if d.selection == "all" else f" {d.selection}")
            + ("" if d.schedule == "steps" else f" {d.schedule}"))


def params(description: RunDescription) -> dict[str, str]:
    """What distinguishes one configuration from another, as tracking parameters (no keys, no endpoints)."""
    d = description
    values = {
        "p": d.p, "n": d.n, "num_workers": d.num_workers, "budget": d.budget, "seed": d.seed,
        "selection": d.selection, "schedule": d.schedule, "reflection_minibatch_size": d.minibatch_size,
        "candidate_selection_strategy": d.candidate_selection, "crossover": d.crossover,
        "task_lm": ",".join(sorted({lm_name(lm) for lm in d.task_lms})),
        "reflection_lm": lm_name(d.reflection_lm) if d.reflection_lm is not None else "custom proposer",
        "program": d.program, "predictors": d.predictors, "code_components": d.code_components,
        "dataset": d.dataset, "trainset_size": d.trainset_size, "valset_size": d.valset_size,
        "testset_size": d.testset_size, **d.caps,
    }
    return {key: str(value) for key, value in values.items()}


def resume_settings(description: RunDescription) -> dict[str, Any]:
    """What a resumed run must share with the run it continues. The budget may differ: it only moves the stopping
    point, so raising it extends a finished run deliberately. The LMs are part of it: a run continued with another
    model, or the same model at another endpoint, would mix two runs' answers into one result."""
    d = description
    return {
        "p": d.p, "n": d.n, "minibatch_size": d.minibatch_size, "seed": d.seed,
        "selection": d.selection, "schedule": d.schedule, "crossover": d.crossover,
        "trainset": d.trainset_digest, "valset": d.valset_digest, "seed_candidate": d.seed_candidate_digest,
        "task_lm": ", ".join(sorted({lm_identity(lm) for lm in d.task_lms})),
        "reflection_lm": lm_identity(d.reflection_lm),
    }
