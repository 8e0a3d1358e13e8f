"""Two simulated models with a price per token, registered with litellm as a user registers a model it
does not know: what the dollar-cap tests bill against."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

PRICES = {  # dollars per token; the reflection model dearer, as it usually is
    "openai/sim-priced-task": (1e-6, 4e-6),
    "openai/sim-priced-reflection": (3e-6, 12e-6),
}


@contextmanager
def priced_models() -> Iterator[None]:
    litellm = pytest.importorskip("litellm")
    for model, (prompt, completion) in PRICES.items():
        litellm.register_model({model: {"input_cost_per_token": prompt, "output_cost_per_token": completion,
                                        "litellm_provider": "openai", "mode": "chat"}})
    try:
        yield
    finally:
        for model in PRICES:
            litellm.model_cost.pop(model, None)
