"""What users' own offline tests and the quickstart run on: the synthetic task and a simulated LM.

- ``task``: the rule-arithmetic task (rules, examples, splits, the feedback metric).
- ``responder``: the simulated model's reply to any DSPy prompt about it (task, reflection,
  dspy.Flex code proposals).
- ``Landscape`` (``DEPTH``, the default; ``BREADTH``): the model's character, i.e. how many
  definitions a reflection learns, how many an instruction holds, how noisy the answers are.
- ``SimulatedLM``: that model in-process, a ``dspy.BaseLM``; ``LatencyServer``: the same model
  behind an OpenAI-compatible HTTP server on loopback, with latencies (fixed, lognormal or
  heavy-tailed) and optional faults.

    from dspy_pxn import testing as sim
    train, val, test = sim.make_splits(seed=0)
    BatchedGEPA(metric=sim.metric, ...).compile(sim.seed_program(), trainset=train, valset=val)
"""

from dspy_pxn.programs.split import Split
from dspy_pxn.testing.landscape import BREADTH, DEPTH, Landscape
from dspy_pxn.testing.loopback import LatencyServer
from dspy_pxn.testing.responder import DEFAULT_REFLECTION_ERROR_RATE, respond
from dspy_pxn.testing.simulated_lm import SimulatedLM
from dspy_pxn.testing.task import (
    CAPACITY,
    RULES,
    RULES_BY_NAME,
    Rule,
    make_examples,
    make_splits,
    metric,
    mlflow_scorer,
    score,
    seed_instruction,
    seed_program,
)
from dspy_pxn.testing.wire import CallStats, chat_completion_body, estimate_tokens

__all__ = [
    "BREADTH", "CAPACITY", "DEFAULT_REFLECTION_ERROR_RATE", "DEPTH", "RULES", "RULES_BY_NAME", "CallStats", "Landscape",
    "LatencyServer", "Rule", "SimulatedLM", "Split", "chat_completion_body", "estimate_tokens", "make_examples", "make_splits", "metric", "mlflow_scorer",
    "respond", "score", "seed_instruction", "seed_program",
]
