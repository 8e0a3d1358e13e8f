"""gepa's pieces that draw a step's work, as BatchedGEPA's arguments name them, for both schedules:
``candidate_selection_strategy`` and ``component_selector`` by name, and the minibatch sampler that gives each
proposal a minibatch of its own (and saves its position for resume)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import Any

from gepa.core.data_loader import DataLoader
from gepa.core.state import GEPAState
from gepa.proposer.reflective_mutation.base import CandidateSelector
from gepa.strategies.batch_sampler import EpochShuffledBatchSampler
from gepa.strategies.candidate_selector import (
    CurrentBestCandidateSelector,
    EpsilonGreedyCandidateSelector,
    ParetoCandidateSelector,
    TopKParetoCandidateSelector,
)
from gepa.strategies.component_selector import AllReflectionComponentSelector, RoundRobinReflectionComponentSelector

# candidate_selection_strategy by name: how parents are drawn from the pool (gepa's selectors).
CANDIDATE_SELECTORS: dict[str, Callable[[random.Random], CandidateSelector]] = {
    "pareto": lambda rng: ParetoCandidateSelector(rng=rng),
    "current_best": lambda rng: CurrentBestCandidateSelector(),
    "epsilon_greedy": lambda rng: EpsilonGreedyCandidateSelector(epsilon=0.1, rng=rng),
    "top_k_pareto": lambda rng: TopKParetoCandidateSelector(k=5, rng=rng),
}


def component_selector(selector: Any) -> Any:
    """gepa's component selector for ``component_selector`` ('round_robin', 'all', or an instance), as
    gepa.optimize builds it: the asynchronous schedule drives the selector itself."""
    named = {"round_robin": RoundRobinReflectionComponentSelector, "all": AllReflectionComponentSelector}
    if isinstance(selector, str):
        if selector not in named:
            raise ValueError(f"component_selector={selector!r} is unknown; use 'round_robin', 'all' or a "
                             "gepa ReflectionComponentSelector.")
        return named[selector]()
    return selector


class SequentialMinibatchSampler(EpochShuffledBatchSampler):
    """gepa's epoch-shuffled minibatches, advancing one minibatch per *call*: gepa's sampler positions each iteration
    at ``iteration × minibatch_size`` and only offsets later calls within it, so with k tasks per iteration consecutive
    steps reuse k−1 of the previous step's minibatches (the same parents on the same data give the same reflection
    prompts). At one call per iteration (1×1) it yields exactly gepa's sequence."""

    def __init__(self, minibatch_size: int, rng):
        super().__init__(minibatch_size=minibatch_size, rng=rng)
        self.calls = 0

    def next_minibatch_ids(self, loader: DataLoader, state: GEPAState) -> list:
        if len(loader) == 0:
            raise ValueError("Cannot sample a minibatch from an empty trainset.")
        position = self.calls * self.minibatch_size
        self.calls += 1
        epoch = 0 if self.epoch == -1 else position // max(len(self.shuffled_ids), 1)
        if not self.shuffled_ids or len(loader) != self.last_trainset_size or epoch > self.epoch:
            self.epoch = epoch
            self._update_shuffled(loader)
        start = position % len(self.shuffled_ids)
        return self.shuffled_ids[start : start + self.minibatch_size]

    def position(self) -> dict[str, Any]:
        """Where the sampler is, and its generator's state: what a resumed run restores (``dspy_pxn.engine.resume``)."""
        return {"sampler_calls": self.calls, "sampler_epoch": self.epoch,
                "sampler_shuffled_ids": list(self.shuffled_ids), "sampler_last_trainset_size": self.last_trainset_size,
                "sampler_id_freqs": dict(self.id_freqs), "rng": self.rng.getstate()}

    def restore(self, saved: dict[str, Any]) -> None:
        self.calls, self.epoch = saved["sampler_calls"], saved["sampler_epoch"]
        self.shuffled_ids = list(saved["sampler_shuffled_ids"])
        self.last_trainset_size = saved["sampler_last_trainset_size"]
        self.id_freqs = Counter(saved["sampler_id_freqs"])
        self.rng.setstate(saved["rng"])
