"""The paper's runtime model of a batched GEPA run: predict, fit from step records, plan P×N.

P×N trades adaptivity (fewer, wider iterations) for throughput. Whether that trade pays
depends on the task-call and reflection latencies, the acceptance rate, the worker pool and
the budget, so a user cannot guess it; the model makes it a calculation.

The model (the paper's, made exact for BatchedGEPA's step structure): a run first validates
the seed, then repeats steps until the budget guard stops it. A step of width k (= P·N, or
fewer when the guard narrows the last step) screens k parents and k children on minibatches
of m examples (k·m rollouts each, in ⌈k·m/W⌉ waves of one task-call latency T_e), runs k
reflections (⌈k/W⌉ waves of T_r), and then, with probability q_k = 1 − (1 − a)^k, fully
validates the accepted children. With j ~ Binomial(k, a) improvers and a selection that keeps
s(j) of them (all: j, best: min(j, 1), top-K: min(j, K)), validation costs s(j)·|val| calls
in ⌈s(j)·|val|/W⌉ waves: one wave when s(j)·|val| ≤ W, about s(j)·|val|/W otherwise — the
paper's case split on kV ≤ W. The budget is drawn down by expected calls per step, with the
guard's own arithmetic for the last steps. The Amdahl-style floor is B·T_e/W.

T_e and T_r are median call times. With ``latency_p99_ratio`` above 1 call times vary
(lognormal, ``dspy_pxn.planning.spread``): a batch then ends with its slowest call, and a
saturated pool pays the mean call time, not the median.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from dspy_pxn.checks import positive_int
from dspy_pxn.engine.records import StepRecord
from dspy_pxn.ledger.budget import BudgetGuard, RunShape
from dspy_pxn.planning.spread import batch_seconds, mean_factor, sigma_of, slowest_factor
from dspy_pxn.proposer import selection as selections
from dspy_pxn.proposer.selection import Selection

__all__ = [
    "RunShape",  # re-exported: the planner's users build one
    "RuntimeModel",
    "Prediction",
    "DEFAULT_SHAPES",
    "shapes_for",
    "floor_seconds",
    "parse_shapes",
]

# The paper's sweep plus the 16-wide shapes; the planner ranks these unless told otherwise.
DEFAULT_SHAPES: tuple[tuple[int, int], ...] = (
    (1, 1), (2, 1), (1, 2), (2, 2), (4, 1), (2, 4), (4, 2), (8, 1),
    (2, 8), (4, 4), (8, 2), (16, 1), (4, 8), (8, 4), (16, 2), (32, 1),
)

# The widest P·N the shapes above reach; a wider pool gets wider shapes (``shapes_for``).
_WIDEST_DEFAULT = max(p * n for p, n in DEFAULT_SHAPES)
# Mutations per parent the wide shapes try: the paper's N stops at 8 too.
_WIDE_MUTATIONS = (1, 2, 4, 8)


def shapes_for(shape: RunShape) -> list[tuple[int, int]]:
    """The shapes worth ranking on this pool: the default ones, and wider ones while the pool can feed them.

    A width k screens k minibatches of m at once, so the pool is full at k·m = W; a width beyond
    W/m only queues. The default shapes stop at 32 wide, which leaves a 256- or 512-worker pool
    mostly idle, so on such a pool every power-of-two width up to W/m is ranked too, each as
    P×1, P×2, P×4 and P×8.
    """
    shapes = list(DEFAULT_SHAPES)
    width = 2 * _WIDEST_DEFAULT
    while width * shape.minibatch_size <= shape.workers:
        shapes += [(width // n, n) for n in _WIDE_MUTATIONS]
        width *= 2
    return shapes


# A prediction within this factor of the floor is pool-bound: only more workers or a
# cheaper task call make it faster.
FLOOR_BOUND_FACTOR = 1.25


def _check_seconds(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}={value!r} must be a finite number of seconds >= 0.")


def floor_seconds(budget: int, task_s: float, workers: int) -> float:
    """The paper's Amdahl-style floor B·T_e/W: every metric call on a saturated pool."""
    return budget * task_s / workers


@dataclass(frozen=True)
class Prediction:
    """A predicted run. ``*_s`` components add up to ``wall_s``."""

    p: int
    n: int
    selection: str
    iterations: int
    validation_trigger_fraction: float  # mean q over the run's steps
    metric_calls: float
    wall_s: float
    floor_s: float
    step_latency_s: float  # reflection + screening at one wave each, + per-step overhead
    validation_latency_s: float  # one wave per validating step (and the seed's)
    pool_wait_s: float  # extra waves because the work is wider than the pool
    binding: str
    schedule: str = "steps"
    # Generations: how many times the pool grows (steps that validate; async validation windows). At a fixed
    # budget this is the depth a search can reach, which wide steps trade away and a merge buys back.
    generations: float = 0.0
    # Chain depth: the generations reached where each improvement builds on the last (``RuntimeModel.link_yield``):
    # what a task of that kind keeps of the depth above. Equal to it one proposal at a time.
    chain_depth: float = 0.0

    @property
    def width(self) -> int:
        return self.p * self.n

    @property
    def x_floor(self) -> float:
        return self.wall_s / self.floor_s if self.floor_s > 0 else math.inf


def _binomial_pmf(k: int, a: float) -> list[float]:
    return [math.comb(k, j) * a**j * (1 - a) ** (k - j) for j in range(k + 1)]


@dataclass(frozen=True)
class RuntimeModel:
    """Latencies and acceptance rate of one task/LM setup; predicts any P×N on any pool."""

    task_s: float  # T_e: one rollout (one metric call) as the optimizer experiences it; the median
    reflection_s: float  # T_r: one reflection call; the median
    acceptance: float  # a: probability that a child beats its parent on the minibatch
    step_overhead_s: float = 0.0  # optimizer bookkeeping per step (selection, Pareto update)
    latency_p99_ratio: float = 1.0  # a call's p99 time over its median: 1 is fixed call times
    fitted_from: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        sigma_of(self.latency_p99_ratio)  # a clear error for a ratio below 1
        _check_seconds("task_s", self.task_s)
        _check_seconds("reflection_s", self.reflection_s)
        _check_seconds("step_overhead_s", self.step_overhead_s)
        a = self.acceptance
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0.0 <= a <= 1.0:
            raise ValueError(f"acceptance={a!r} must be a probability in [0, 1] (accepted / proposed children).")

    @property
    def sigma(self) -> float:
        """σ of the lognormal call times (0: fixed)."""
        return sigma_of(self.latency_p99_ratio)

    def trigger_probability(self, width: int) -> float:
        """q_k = 1 − (1 − a)^k: the chance that a step of width k validates anything."""
        return 1.0 - (1.0 - self.acceptance) ** width

    def floor(self, shape: RunShape) -> float:
        return floor_seconds(shape.budget, self.task_s, shape.workers)

    def link_yield(self, in_flight: int) -> float:
        """The chance that one try adds a link to a chain (a task where each improvement builds on the last) with
        ``in_flight`` tries running side by side: a/(1 + a·(in_flight − 1)).

        One at a time, a link costs 1/a tries. Side by side, the tries in flight when the next link is found were
        started from the link before it: on a chain they can only find the link just found, so each link costs
        the in_flight − 1 of them as well. Measured on the chain landscape (W 16, B 600, 10 seeds each): one link
        per 5.6 tries one at a time, and 1/(1 + a·(w − 1)) of that yield within 11% at 2, 3, 4 and 5 in flight
        (docs/benchmark-log.md, "Why no width keeps the chain"). Where improvements are independent the tries
        beside a found link find other ones, which the sibling merge and the crossover fold in: there width costs
        no depth, which is ``generations``.
        """
        positive_int("in_flight", in_flight, "It is the number of proposals running side by side (P·N).")
        a = self.acceptance
        return a / (1.0 + a * (in_flight - 1))

    def predict(
        self, p: int, n: int, shape: RunShape, selection: Selection = "all", schedule: str = "steps",
        reflection_rows: int | None = None,
    ) -> Prediction:
        """Expected wall-clock, iterations, validation-trigger fraction and generations of a P×N run.

        ``reflection_rows`` (async): the rows of each minibatch the parent is traced on and its reflection reads,
        when fewer than m; the rest are screened only for a child that beat its parent on them (the async schedule's
        staged screening, BatchedGEPA's default above one proposal at a time). None: all m."""
        positive_int("p", p, "P is the number of parents per step.")
        positive_int("n", n, "N is the number of mutations per parent.")
        name = selections.label(selections.spec(selection))
        if schedule == "async":
            return self._predict_async(p, n, shape, selection, name, reflection_rows)
        if schedule != "steps":
            raise ValueError(f"schedule={schedule!r} must be 'steps' or 'async'.")
        merges = selections.spec(selection) in selections.MERGES
        W, V, m = shape.workers, shape.val_size, shape.minibatch_size
        T_e, T_r = self.task_s, self.reflection_s
        guard = BudgetGuard.of(shape)  # the optimizer's own arithmetic, on expected remaining calls

        sigma = self.sigma
        mean = mean_factor(sigma)

        def slowest(calls: int, call_s: float) -> float:  # the last wave of a batch: its slowest call
            return call_s * slowest_factor(min(calls, W), sigma)

        # Seed validation: V calls before the first step.
        remaining = float(shape.budget - V)
        step_latency = 0.0
        validation_latency = slowest(V, T_e)
        pool_wait = (math.ceil(V / W) - 1) * T_e * mean
        iterations, triggers = 0, 0.0
        while guard.can_step(remaining):  # ExactBudgetStopper
            width = min(p * n, guard.widest_step(remaining))
            if width < 1:
                break
            screen_waves = math.ceil(width * m / W)
            reflect_waves = math.ceil(width / W)
            room = guard.validations_affordable(remaining - 2 * width * m)  # BudgetCappedSelection's cap
            calls, extra_waves, trigger, merging, last_wave_s = 2 * width * m, 0.0, 0.0, 0.0, 0.0
            for improvers, probability in enumerate(_binomial_pmf(width, self.acceptance)):
                validated = min(selections.kept(selection, improvers), room)
                calls += probability * validated * V
                if validated:
                    extra_waves += probability * (math.ceil(validated * V / W) - 1)
                    last_wave_s += probability * slowest(validated * V, T_e)
                trigger += probability * (validated > 0)
                merging += probability * (merges and improvers >= 2)  # one more reflection wave: the merge call
            trigger = min(trigger, 1.0)  # the pmf's float sum can exceed 1 by an ulp
            step_latency += (self.step_overhead_s + 2 * slowest(width * m, T_e) + slowest(width, T_r)
                             + merging * T_r * mean)
            validation_latency += last_wave_s
            pool_wait += ((2 * (screen_waves - 1)) * T_e + (reflect_waves - 1) * T_r + extra_waves * T_e) * mean
            remaining -= calls
            iterations += 1
            triggers += trigger

        wall = step_latency + validation_latency + pool_wait
        floor = self.floor(shape)
        return Prediction(
            p=p, n=n, selection=name, iterations=iterations,
            validation_trigger_fraction=triggers / iterations if iterations else 0.0,
            metric_calls=shape.budget - remaining, wall_s=wall, floor_s=floor,
            step_latency_s=step_latency, validation_latency_s=validation_latency, pool_wait_s=pool_wait,
            binding=_binding(wall, floor, step_latency, validation_latency, pool_wait), generations=triggers,
            chain_depth=triggers,  # a step's tries all start from the same pool: it adds one link at most
        )

    def _predict_async(self, p: int, n: int, shape: RunShape, selection: Selection, name: str,
                       reflection_rows: int | None = None) -> Prediction:
        """``schedule="async"``: K = P·N pipelines in flight, validations back to back in *windows*.

        A pipeline takes t_p = 2·T_e + T_r (parent, reflection, child) while the pool keeps up; the
        pool delivers at most W/T_e rollouts a second, shared with the validations, so proposals
        finish at R = min(K/t_p, (W/T_e − validation rollouts a second)/(2m)). A window lasts one
        validation (T_e per wave, plus T_r when a merge combines two or more children) and, when
        improvers are rare, the wait for the next one (1/(a·R)); the improvers it validates are the
        one that opened it plus those that landed during the previous validation (a·R·t_v). Windows
        repeat until the budget, less the launch rule's reserve of 2m + |val|, is spent; the start (every
        pipeline reflecting at once) and, on a full pool, the last validation add their idle time. With a latency
        spread a screening waits for the slowest of its m calls, a validation for the slowest of its
        last wave, and the pool delivers W/mean call time. Screened in stages (``reflection_rows`` r < m), a
        proposal costs 2r calls, and 2m with one more wave of T_e for the share a that goes on (measured: the
        children that beat their parents on r rows are about the ones that improve on m).
        """
        W, V, m = shape.workers, shape.val_size, shape.minibatch_size
        T_e, T_r, a, K = self.task_s, self.reflection_s, self.acceptance, p * n
        sigma = self.sigma
        mean = mean_factor(sigma)
        spec = selections.spec(selection)
        r = min(reflection_rows or m, m)
        proposal_calls = 2 * r + a * 2 * (m - r)
        t_p = (2 * T_e * slowest_factor(r, sigma) + T_r * mean + self.step_overhead_s
               + (a * T_e * slowest_factor(m - r, sigma) if m > r else 0.0))
        seed_s = batch_seconds(V, W, T_e, sigma)
        capacity = W / (T_e * mean)  # rollouts a second on a saturated pool
        spent = shape.budget - (2 * m + V) / 2  # the launch rule stops within one proposal and one validation of B
        budget = spent - V
        rate = K / t_p
        window = t_v = T_e
        kept, improvers = 1, 1.0
        for _ in range(20):  # a fixed point: the rate, the window and the validated count depend on each other
            improvers = 1.0 + a * rate * t_v
            kept = max(1, selections.kept(spec, round(improvers)))
            t_v = batch_seconds(kept * V, W, T_e, sigma) + (
                T_r * mean if spec in selections.MERGES and improvers >= 2 else 0.0)
            window = t_v + (1.0 / (a * rate) if a > 0 else math.inf)
            pool_left = max(capacity - kept * V / window, capacity / 10)
            rate = min(K / t_p, pool_left / proposal_calls)
        pool_bound = rate < K / t_p - 1e-9
        # The first K pipelines start together: all screen, then all reflect with nothing else for the pool
        # to run, then all screen their children, a cycle longer than the steady state's K/rate.
        ramp = max(0.0, 2 * batch_seconds(K * r, W, T_e, sigma) + T_r * mean + self.step_overhead_s - K / rate)
        # On a full pool the validations' calls are paid at the pool's rate; the last one runs as the pool
        # empties, so its own duration shows.
        drain = max(0.0, t_v - kept * V / capacity) if pool_bound else 0.0
        if a <= 0 or math.isinf(window):
            proposals = max(0.0, budget / proposal_calls)
            generations, wall = 0.0, seed_s + ramp + proposals / rate
        else:
            per_window = proposal_calls * rate * window + kept * V
            generations = max(0.0, budget / per_window)
            proposals = generations * rate * window
            wall = seed_s + ramp + generations * window + drain
        floor = self.floor(shape)
        return Prediction(
            p=p, n=n, selection=name, iterations=math.ceil(generations), validation_trigger_fraction=1.0,
            metric_calls=spent, wall_s=wall, floor_s=floor, step_latency_s=wall - seed_s,
            validation_latency_s=seed_s, pool_wait_s=0.0,
            binding="floor" if wall <= FLOOR_BOUND_FACTOR * floor else ("worker pool" if pool_bound else "step latency"),
            schedule="async", generations=generations,
            chain_depth=min(generations, proposals * self.link_yield(K)),
        )

    def plan(
        self,
        shape: RunShape,
        shapes: Sequence[tuple[int, int]] | None = None,
        selection: Selection = "all",
    ) -> list[Prediction]:
        """Predictions for ``shapes`` (default: ``shapes_for(shape)``), fastest first (ties: more iterations,
        then more parents)."""
        shapes = shapes_for(shape) if shapes is None else shapes
        if not shapes:
            raise ValueError("shapes is empty: pass P×N pairs such as [(1, 1), (2, 2), (8, 1)].")
        predictions = [self.predict(p, n, shape, selection) for p, n in shapes]
        return sorted(predictions, key=lambda pr: (round(pr.wall_s, 6), -pr.iterations, -pr.p))

    def front(self, predictions: Sequence[Prediction]) -> list[Prediction]:
        """The predictions no other beats on both wall-clock and generations, fastest first.

        Wall-clock alone would always pick the widest step, which buys speed by giving up
        generations (depth); the front shows what each extra second buys.
        """
        def beaten(pr: Prediction) -> bool:
            return any(o.wall_s <= pr.wall_s and o.generations >= pr.generations
                       and (o.wall_s < pr.wall_s or o.generations > pr.generations) for o in predictions)

        front, seen = [], set()
        for pr in sorted((pr for pr in predictions if not beaten(pr)), key=lambda pr: pr.wall_s):
            point = (round(pr.wall_s, 6), round(pr.generations, 6))
            if point not in seen:  # settings the model cannot tell apart: the first stands for them
                seen.add(point)
                front.append(pr)
        return front

    @classmethod
    def fit(
        cls,
        steps: Sequence[StepRecord],
        *,
        workers: int | None = None,
        minibatch_size: int | None = None,
        val_size: int | None = None,
    ) -> RuntimeModel:
        """Estimate T_e, T_r, a and the per-step overhead from finished runs' step records.

        T_e is the screening and validation time divided by the waves the model says they
        took, T_r likewise for reflection, and a = improvers / proposals. Records from several
        runs of one setup may be pooled; sizes missing from old records can be passed in.
        """
        reflective = [s for s in steps if s.kind == "reflective" and s.width > 0]
        if not reflective:
            raise ValueError("steps has no reflective step with proposals; fit needs a run that made progress.")
        eval_s = eval_waves = reflect_s = reflect_waves = overhead = 0.0
        stepped = 0
        proposals = improvers = 0
        for s in reflective:
            W = workers or s.num_workers
            m = minibatch_size or s.minibatch_size
            V = val_size or s.val_size
            if not (W and m and V):
                raise ValueError(
                    f"step {s.step} does not record num_workers/minibatch_size/val_size; "
                    "pass workers=, minibatch_size= and val_size= to fit()."
                )
            eval_s += s.screening_s + s.validation_s
            reflect_s += s.reflection_s
            if s.schedule == "async":  # each pipeline's evaluation is its own call: times are summed per call
                eval_waves += 2 * s.width * math.ceil(m / W) + (math.ceil(s.accepted * V / W) if s.accepted else 0)
                reflect_waves += s.width
            else:
                eval_waves += 2 * math.ceil(s.width * m / W) + math.ceil(s.accepted * V / W)
                reflect_waves += math.ceil(s.width / W)
            if s.schedule != "async":  # overlapping pipelines leave no per-step bookkeeping to read off
                overhead += max(0.0, s.wall_s - s.reflection_s - s.screening_s - s.validation_s)
                stepped += 1
            proposals += s.width
            # Records written before `improved` existed: accepted is the best estimate.
            improvers += s.improved if s.improved or not s.accepted else s.accepted
        return cls(
            task_s=eval_s / eval_waves,
            reflection_s=reflect_s / reflect_waves,
            acceptance=min(1.0, improvers / proposals),
            step_overhead_s=overhead / stepped if stepped else 0.0,
            fitted_from=(f"{len(reflective)} steps",),
        )


def _binding(wall: float, floor: float, step: float, validation: float, pool: float) -> str:
    """Which ceiling limits this run: the one whose removal would save the most time."""
    if wall <= FLOOR_BOUND_FACTOR * floor:
        return "floor"
    return max(
        (("step latency", step), ("validation trigger", validation), ("worker pool", pool)),
        key=lambda item: item[1],
    )[0]


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """'1x1,2x2,8x1' -> [(1, 1), (2, 2), (8, 1)], with an error that shows the format."""
    shapes = []
    for part in text.split(","):
        try:
            p, n = (int(v) for v in part.strip().lower().split("x"))
        except ValueError:
            raise ValueError(f"shape {part.strip()!r} is not PxN; write shapes like '1x1,2x2,8x1'.") from None
        if p < 1 or n < 1:
            raise ValueError(f"shape {part.strip()!r} needs P >= 1 and N >= 1.")
        shapes.append((p, n))
    return shapes
