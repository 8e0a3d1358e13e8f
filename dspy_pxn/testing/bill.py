"""The bill of a benchmark run, stated one way for every comparison in benchmarks/ and the docs.

Calls and tokens are counted where the calls were answered (the simulated LM or the latency server: the tokens
of the text actually sent and received), per role; dollars are those tokens at one stated price pair, the list
prices of the price map DSPy ships (read offline): a gpt-4.1-mini task model and a gpt-5 reflection model, as
DSPy's GEPA tutorials pair them.
"""

from __future__ import annotations

from typing import Any

from dspy_pxn.ledger.prices import token_prices, use_bundled_price_maps

PRICE_PAIR = {"task": "openai/gpt-4.1-mini", "reflection": "openai/gpt-5"}


def dollars(bill: dict[str, dict[str, Any]]) -> float:
    """``bill`` ({role: {"prompt": tokens, "completion": tokens, ...}}) at the price pair."""
    use_bundled_price_maps()  # no network: the map DSPy ships
    return sum(token_prices(model).of(bill[role]["prompt"], bill[role]["completion"])
               for role, model in PRICE_PAIR.items())


def from_server(stats: dict[str, Any]) -> dict[str, dict[str, int]]:
    """The bill from a latency server's stats: its task and reflection models' calls and tokens."""
    empty = {"calls": 0, "prompt": 0, "completion": 0}
    return {role: dict(stats["tokens"].get(f"sim-{role}", empty)) for role in PRICE_PAIR}


def from_simulated(task: Any, reflection: Any) -> dict[str, dict[str, int]]:
    """The bill from the in-process simulated task and reflection LMs (``SimulatedLM``): their calls and tokens."""
    bill = {}
    for role, model in (("task", task), ("reflection", reflection)):
        stats = model.call_stats.snapshot()
        bill[role] = {"calls": stats["calls"]["total"], **stats["tokens"]}
    return bill
