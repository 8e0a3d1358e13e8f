"""What a run optimizes: the one thing ``dspy_pxn.engine.run`` asks of a DSPy program, or of anything else.

The engine (budget, pool, ledger, schedules, reflection, sibling merge, crossover) works on gepa's candidates,
``dict[str, str]``, through a ``PooledAdapter``. A ``Target`` is the rest: where the seed candidate comes from, which
data it accepts, which LMs the task holds, the adapter its rollouts run on. What a finished search returns is the
caller's (each target has its own ``result``, after ``run.ended()``). A DSPy program is one
(``dspy_pxn.targets.program``), MLflow prompt templates another (``dspy_pxn.targets.mlflow_prompts``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from dspy_pxn.engine.events import StepEvents
from dspy_pxn.engine.pooled_adapter import PooledAdapter
from dspy_pxn.engine.resume import Checkpoint
from dspy_pxn.pools import WorkerPool

if TYPE_CHECKING:
    from dspy_pxn.settings import Settings


@dataclass(frozen=True)
class TargetShape:
    """How a target is described to tracking and resume (``dspy_pxn.engine.description.RunDescription``)."""

    name: str  # the program's class, or what the candidates are ("mlflow prompts")
    components: int  # predictors (or prompts) the candidate holds
    task_lms: tuple[Any, ...]  # the LMs the task calls, where the run can see them
    input_example: dict[str, Any]  # one validation example's inputs


@dataclass(frozen=True)
class TargetData:
    """What a target says of a compile's data and of itself, once, before the first LM call (``Target.prepare``)."""

    trainset: list[Any]
    valset: list[Any]
    testset: list[Any] | None
    shape: TargetShape
    lms: tuple[Any, ...]  # the task's LMs and what holds them (``feed.reachable_lms`` roots): their calls are the run's


class Target(Protocol):
    """What a run optimizes, besides the candidate texts the engine searches over."""

    seed_candidate: dict[str, str]
    code_components: tuple[str, ...]  # components that are code (dspy.Flex sources), not instructions

    def prepare(self, settings: Settings, trainset: Any, valset: Any, testset: Any) -> TargetData:
        """The data, checked (a bad argument raises naming it; a missing valset as this target's users expect), every
        check the target makes before the first LM call, how it is described, and the LMs its task holds."""

    def around_search(self) -> AbstractContextManager[Any]:
        """Entered for the whole search (a DSPy compile's ``around_compile``, e.g. no trace per rollout in autolog)."""

    def adapter(self, settings: Settings, pool: WorkerPool, events: StepEvents, reflection_examples: int,
                checkpoint: Checkpoint) -> PooledAdapter:
        """The run's adapter; reflection reads the ``reflection_examples`` lowest-scoring rows of a screening, and
        ``checkpoint`` rides in gepa's state as the adapter's own (``engine.resume``)."""
