"""The train/val/test triple every data loader returns, here and in ``programs/``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import dspy


@dataclass(frozen=True)
class Split:
    """train/val/test example lists; iterable so ``train, val, test = load_...()`` works."""

    train: list[dspy.Example]
    val: list[dspy.Example]
    test: list[dspy.Example]

    def __iter__(self) -> Iterator[list[dspy.Example]]:
        return iter((self.train, self.val, self.test))
