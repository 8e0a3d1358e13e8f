"""Landscapes: the character of the simulated model, i.e. how hard the rule task is to optimize.

The data never change (``task.make_splits``); a landscape changes only how the simulated
model answers and reflects. Three presets:

- ``DEPTH`` (the default, and the only landscape before issue 14): one definition learned
  per reflection call, at most ``CAPACITY`` (5) per instruction, each copied wrong with
  probability ``DEFAULT_REFLECTION_ERROR_RATE`` (0.4), and no answer noise. Progress is a
  slow, deep climb; a candidate's val score is exact, so selection cannot overfit val.

- ``CHAIN``: each improvement builds on the last: one definition per reflection call, and only the
  chain's next rule (the most frequent one the instruction does not hold exactly), so no reflection can
  skip ahead, siblings of one parent learn the same rule, and every rule costs a generation. Capacity 12
  (every rule), the same copy error rate, no answer noise.

- ``BREADTH``: up to 3 definitions learned per reflection call, capacity 8, the same copy
  error rate, and *answer noise*: knowing a rule, the task model still slips with
  probability 0.15; not knowing it (absent or garbled), it guesses right with probability
  0.15. The noise is a deterministic function of (instruction text, question), so a
  candidate scores the same on the same example every time, but any edit to the
  instruction re-draws its luck on every example. A search that keeps the best of many
  candidates on one valset therefore picks lucky ones: best val over-states held-out.
  That is the paper's val→test argument, which DEPTH cannot show.

Why these numbers. Slip and guess at 0.15 make each answer a coin with a 15% bias, so
|val| = 30 misjudges a candidate by about ±0.065 (one σ): small next to what learning
gains (the top 8 of 12 rules cover 88% of questions; the ceiling is about 0.76), large
enough that the best of ~15 candidates is partly the luckiest. Measured with 1×1
``BatchedGEPA``, in-process ``SimulatedLM``, budget 600, ``make_splits(seed)`` (|train|
60, |val| 30, |test| 100), seeds 0-4::

    python -m dspy_pxn.testing.measure_landscape --landscape breadth --seeds 5

    seed   seed val  seed test   best val   test   best's val, luck re-drawn
    0      0.233     0.130       0.467      0.350  0.460
    1      0.167     0.120       0.800      0.660  0.637
    2      0.300     0.120       0.800      0.690  0.713
    3      0.033     0.130       0.700      0.550  0.667
    4      0.067     0.160       0.667      0.470  0.580
    mean   0.160     0.132       0.687      0.544  0.611   (DEPTH: 0 / 0 / 0.687 / 0.618)

Held-out rises from 0.13 to 0.54, and best val over-states it by +0.14. One seed's test
of 100 swings by ±0.1, so the comparison was repeated over 20 seeds with |test| = 1000
(``--seeds 20 --test-size 1000``): best val - test = +0.097 on BREADTH against +0.072
on DEPTH (where selection fits only the val sample's rule mix), and best val - its own
val with the luck re-drawn = +0.083 (exactly 0 on DEPTH): that is selection picking
lucky candidates. Slip = guess = 0.10 gave a luck share of +0.052 (test 0.68), 0.20 gave
+0.080 (test 0.60, seed test already 0.22): 0.15 is clearly noisy and still learnable.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

from dspy_pxn.testing.task import CAPACITY


@dataclass(frozen=True)
class Landscape:
    """How the simulated model learns and answers; every field's default is today's DEPTH model.

    ``error_rate`` None means "the responder's module default" (``DEFAULT_REFLECTION_ERROR_RATE``),
    so benchmarks that tune that global keep tuning every landscape that does not pin its own.
    """

    name: str = "depth"
    learn_per_call: int = 1  # new definitions a reflection takes from the feedback per call
    capacity: int = CAPACITY  # definitions an instruction holds; the oldest is evicted beyond it
    error_rate: float | None = None  # probability each learned definition is copied wrong
    slip_rate: float = 0.0  # P(wrong answer | the instruction knows the rule)
    guess_rate: float = 0.0  # P(right answer | it does not: absent or garbled)
    chain: bool = False  # a reflection learns only the next rule in frequency order (CHAIN)

    def __post_init__(self) -> None:
        if self.learn_per_call < 1 or self.capacity < 1:
            raise ValueError(f"landscape {self.name!r}: learn_per_call and capacity must be >= 1")
        for field_name in ("slip_rate", "guess_rate"):
            if not 0.0 <= getattr(self, field_name) <= 1.0:
                raise ValueError(f"landscape {self.name!r}: {field_name} must be in [0, 1]")
        if self.error_rate is not None and not 0.0 <= self.error_rate <= 1.0:
            raise ValueError(f"landscape {self.name!r}: error_rate must be in [0, 1] or None")

    @property
    def noisy(self) -> bool:
        return self.slip_rate > 0 or self.guess_rate > 0

    def to_json(self) -> str:
        """Its fields as JSON: how ``LatencyServer`` hands a custom landscape to its subprocess."""
        return json.dumps(asdict(self), sort_keys=True)


DEPTH = Landscape()
BREADTH = Landscape(name="breadth", learn_per_call=3, capacity=8, error_rate=None, slip_rate=0.15, guess_rate=0.15)
# Each improvement builds on the last: a reflection learns a rule only once the instruction holds every more
# frequent rule exactly (the chain's next one, when the feedback shows it), so siblings of one parent learn the
# same rule, a merge of them adds one rule, and progress needs one generation per rule. Room for all 12 rules.
CHAIN = Landscape(name="chain", capacity=12, chain=True)

LANDSCAPES: dict[str, Landscape] = {DEPTH.name: DEPTH, BREADTH.name: BREADTH, CHAIN.name: CHAIN}


def resolve_landscape(value: Landscape | str | None) -> Landscape:
    """A ``Landscape`` from itself, a preset name ("depth", "breadth", "chain"), its JSON, or None (DEPTH)."""
    if value is None:
        return DEPTH
    if isinstance(value, Landscape):
        return value
    text = str(value).strip()
    if text.lower() in LANDSCAPES:
        return LANDSCAPES[text.lower()]
    if text.startswith("{"):
        data = json.loads(text)
        known = {f.name for f in fields(Landscape)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown landscape fields {sorted(unknown)}; known: {sorted(known)}")
        return Landscape(**data)
    raise ValueError(f"unknown landscape {value!r}: choose one of {', '.join(LANDSCAPES)} (or a Landscape's JSON)")
