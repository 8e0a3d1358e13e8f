"""schedule="async": the invariants an asynchronous run must keep (it is not bit-reproducible).

Exact budget, every rollout counted once (counts = gepa's state = the LM's own call count),
a consistent lineage, one record per window that adds up, the pool really reaching W at the
server, and a killed run resuming from its last saved window.
"""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import dspy
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dspy_pxn import BatchedGEPA, read_step_log
from dspy_pxn import testing as sim
from dspy_pxn.engine.resume import load_saved_state
from tests.budgets import smallest_step
from tests.compiling import compile_sim, reflection_prompts
from tests.threads import threads_left_behind


@pytest.mark.parametrize("selection", ["all", "best", 2, "merge", "merge+best"])
def test_an_async_run_counts_every_rollout_once_and_stays_on_budget(splits, selection):
    lm = sim.SimulatedLM()
    budget = 300
    result = compile_sim(splits=splits, lm=lm, schedule="async", p=4, n=2, max_metric_calls=budget,
                         selection=selection).results
    val_size = len(splits.val)
    assert result.total_metric_calls <= budget
    assert budget - result.total_metric_calls < 2 * 3 + val_size  # it stops only when no proposal fits
    # Every metric call is one task call of the program (ChainOfThought: one LM call per rollout) ...
    assert lm.stats()["calls"]["task"] == result.total_metric_calls
    # ... and every one of them is in exactly one record (the seed's validation before the first).
    assert sum(step.metric_calls for step in result.steps) + val_size == result.total_metric_calls
    assert sum(step.rollouts for step in result.steps) + val_size == result.total_metric_calls
    assert [s.step for s in result.steps] == list(range(1, len(result.steps) + 1))
    assert sum(s.accepted for s in result.steps) == len(result.candidates) - 1
    # Lineage: every candidate's parents were in the pool before it.
    for index, parents in enumerate(result.parents[1:], start=1):
        assert parents and all(p is not None and p < index for p in parents)


def test_async_keeps_width_proposals_in_flight_and_reaches_w_at_the_server(splits):
    with sim.LatencyServer(task_latency=0.05, reflection_latency=0.2) as server:
        result = compile_sim(splits=splits, lm=server.lm("task"), schedule="async", p=4, n=2, num_threads=8,
                             max_metric_calls=200, reflection_lm=server.lm("reflection")).results
        stats = server.stats()
    assert stats["max_in_flight"]["task"] == 8  # the pool is full: W rollouts at once
    assert stats["max_in_flight"]["reflection"] >= 2  # reflections overlap rollouts and each other
    assert stats["calls"]["task"] == result.total_metric_calls <= 200


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    p=st.integers(1, 4), n=st.integers(1, 3), minibatch=st.integers(1, 3), val_size=st.integers(1, 10),
    extra=st.integers(0, 150), workers=st.integers(1, 8), selection=st.sampled_from(["all", "best", "merge"]),
)
def test_async_budget_property(p, n, minibatch, val_size, extra, workers, selection):
    train, val, _ = sim.make_splits(seed=1, train=20, val=val_size, test=1)
    budget = 2 * val_size + 2 * minibatch + extra
    lm = sim.SimulatedLM()
    result = compile_sim(splits=(train, val), lm=lm, p=p, n=n, max_metric_calls=budget,
                         reflection_minibatch_size=minibatch, num_threads=workers, schedule="async",
                         selection=selection).results
    assert result.total_metric_calls <= budget
    assert budget - result.total_metric_calls < smallest_step(minibatch, val_size)
    assert lm.stats()["calls"]["task"] == result.total_metric_calls


def test_async_with_an_argument_only_gepas_loop_reads_is_refused():
    with pytest.raises(ValueError, match="schedule='fastest' is not understood"):
        BatchedGEPA(metric=sim.metric, reflection_lm=sim.SimulatedLM(), schedule="fastest")
    with pytest.raises(ValueError, match=r"gepa_kwargs \['cache_evaluation'\] are read by gepa's step loop"):
        BatchedGEPA(metric=sim.metric, reflection_lm=sim.SimulatedLM(), schedule="async",
                    gepa_kwargs={"cache_evaluation": True})
    with pytest.raises(ValueError, match="use_wandb=True logs from inside gepa's step loop"):
        BatchedGEPA(metric=sim.metric, reflection_lm=sim.SimulatedLM(), schedule="async", use_wandb=True)


def test_the_width_chooses_what_was_left_open_and_the_step_loop_wherever_async_would_ignore_an_argument():
    """One proposal per step is dspy.GEPA's loop; wider, async with the sibling merge, unless an argument
    only gepa's step loop reads was given."""
    from dspy_pxn.engine.run import search_plan

    def plan(width, **kwargs):
        optimizer = BatchedGEPA(metric=sim.metric, reflection_lm=sim.SimulatedLM(), **kwargs)
        return search_plan(optimizer.settings, width)

    assert plan(1) == plan(1, p=1, n=1) == ("steps", "all")
    assert plan(16) == plan(16, p=4, n=4) == ("async", "merge")
    assert plan(16, use_merge=True) == ("async", "merge")  # gepa's crossover runs beside the pipelines
    assert plan(16, gepa_kwargs={"cache_evaluation": True}) == ("steps", "merge")
    assert plan(16, gepa_kwargs={"use_cloudpickle": True}) == ("async", "merge")
    assert plan(16, schedule="steps", selection="all") == ("steps", "all")


RUN_SCRIPT = textwrap.dedent('''
    import sys, dspy
    from dspy_pxn import BatchedGEPA, testing as sim
    url, log_dir = sys.argv[1], sys.argv[2]
    def lm(kind):
        return dspy.LM(f"openai/sim-{kind}", api_base=url, api_key="sim", cache=False, temperature=0.0,
                       num_retries=0)
    train, val, _ = sim.make_splits(seed=0, train=24, val=8, test=1)
    with dspy.context(lm=lm("task")):
        BatchedGEPA(metric=sim.metric, reflection_lm=lm("reflection"), log_dir=log_dir, p=2, n=2,
                    max_metric_calls=160, num_threads=8, schedule="async").compile(
            sim.seed_program(), trainset=train, valset=val)
''')


def test_a_killed_async_run_resumes_losing_only_the_work_in_flight(tmp_path):
    log_dir = tmp_path / "crashed"
    script = tmp_path / "run.py"
    script.write_text(RUN_SCRIPT)
    with sim.LatencyServer(task_latency=0.05, reflection_latency=0.2) as server:
        env = dict(os.environ, PYTHONPATH=os.getcwd(), LITELLM_LOCAL_MODEL_COST_MAP="True")
        process = subprocess.Popen([sys.executable, str(script), server.base_url, str(log_dir)], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 90
        try:
            while len(read_step_log(str(log_dir))) < 2:
                assert process.poll() is None, process.stderr.read().decode()[-2000:]
                assert time.monotonic() < deadline
                time.sleep(0.02)
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=10)
        saved = load_saved_state(str(log_dir))
        assert saved is not None and saved.total_num_evals < 160
        calls_before = server.stats()["calls"]["task"]
        train, val, _ = sim.make_splits(seed=0, train=24, val=8, test=1)
        resumed = compile_sim(splits=(train, val), lm=server.lm("task"), reflection_lm=server.lm("reflection"),
                              log_dir=str(log_dir), p=2, n=2, max_metric_calls=160, num_threads=8,
                              schedule="async").results
        resumed_calls = server.stats()["calls"]["task"] - calls_before
    # The seed is not re-validated, and every call the resumed process made is counted once.
    assert resumed_calls == resumed.total_metric_calls - saved.total_num_evals
    assert resumed.total_metric_calls <= 160
    # The candidates the saved state had are kept, in order, with their scores.
    kept = len(saved.program_candidates)
    assert [c.predict.signature.instructions for c in resumed.candidates[:kept]] == [
        c["predict"] for c in saved.program_candidates]
    assert [s.step for s in resumed.steps] == list(range(1, len(resumed.steps) + 1))
    assert read_step_log(str(log_dir)) == list(resumed.steps)


class Heard:
    """A user's gepa callback: what gepa's own engine would have told it."""

    def __init__(self):
        self.events: list[tuple[str, dict]] = []

    def __getattr__(self, name):
        if not name.startswith("on_") or name == "on_step_record":  # gepa's events (a StepRecord is dspy-pxn's)
            raise AttributeError(name)
        return lambda event: self.events.append((name, event))


def test_a_users_gepa_callbacks_hear_an_async_run_as_they_hear_gepas_loop(splits):
    heard = Heard()
    result = compile_sim(splits=splits, lm=sim.SimulatedLM(), schedule="async", p=4, n=2, max_metric_calls=200,
                         gepa_kwargs={"callbacks": [heard]}).results
    names = [name for name, _ in heard.events]
    starts = [e["iteration"] for n, e in heard.events if n == "on_iteration_start"]
    ends = [e["iteration"] for n, e in heard.events if n == "on_iteration_end"]
    assert names[0] == "on_optimization_start" and names[-1] == "on_optimization_end"
    assert len(starts) == len(ends) >= len(result.steps)  # every iteration that starts, ends
    accepted = [e["new_candidate_idx"] for n, e in heard.events if n == "on_candidate_accepted"]
    assert accepted == list(range(1, len(result.candidates)))
    validated = [e["candidate_idx"] for n, e in heard.events if n == "on_valset_evaluated"]
    assert validated == list(range(len(result.candidates)))  # the seed, then each accepted candidate
    assert names.count("on_candidate_rejected") == sum(s.proposals - s.accepted for s in result.steps) > 0


# Announced by gepa's engine (GEPAEngine.run), as opposed to its proposer's per-task events.
ENGINE_EVENTS = {
    "on_optimization_start", "on_optimization_end", "on_iteration_start", "on_iteration_end", "on_state_saved",
    "on_valset_evaluated", "on_pareto_front_updated", "on_candidate_accepted", "on_candidate_rejected",
    "on_budget_updated",
}


def test_the_async_schedule_tells_every_engine_event_with_gepas_own_fields(splits, tmp_path):
    heard = {}
    for schedule in ("steps", "async"):
        heard[schedule] = Heard()
        compile_sim(splits=splits, lm=sim.SimulatedLM(), p=2, n=2, max_metric_calls=150, num_threads=8,
                    schedule=schedule, gepa_kwargs={"callbacks": [heard[schedule]]}, log_dir=str(tmp_path / schedule))
    by_name = {schedule: {} for schedule in heard}
    for schedule, listener in heard.items():
        for name, event in listener.events:
            by_name[schedule].setdefault(name, set(event))
    assert ENGINE_EVENTS <= set(by_name["steps"]) and ENGINE_EVENTS <= set(by_name["async"])
    for name in ENGINE_EVENTS:
        assert by_name["async"][name] == by_name["steps"][name], name  # the same fields, gepa's event types
    # gepa's numbering: iterations 1, 2, ... as each starts, the seed's validation at iteration 0.
    starts = [e["iteration"] for n, e in heard["async"].events if n == "on_iteration_start"]
    assert starts == list(range(1, len(starts) + 1))
    seed = next(e for n, e in heard["async"].events if n == "on_valset_evaluated")
    assert seed["iteration"] == 0 and seed["candidate_idx"] == 0


def test_a_second_validation_starts_beside_the_first_only_once_enough_improvers_wait(monkeypatch):
    from dspy_pxn.engine import width as widths
    from dspy_pxn.schedules.asynchronous import AsyncSchedule

    starts: list[tuple[int, int]] = []  # (validations already running, improvers it was given), per validation
    running, lock = {"now": 0, "peak": 0}, threading.Lock()
    a_later_one_joined = threading.Event()
    validate, join = AsyncSchedule._select_and_validate, AsyncSchedule._join

    def counted(self, batch, room):
        with lock:
            starts.append((running["now"], len(batch)))
            first = len(starts) == 1
            running["now"] += 1
            running["peak"] = max(running["peak"], running["now"])
        try:
            validated = validate(self, batch, room)
            if first:  # hold the first one's candidates back until a later validation's have joined the
                a_later_one_joined.wait(timeout=30)  # state: its rollouts ended in an earlier window
            return validated
        finally:
            with lock:
                running["now"] -= 1

    def joined(self, validated):
        released = join(self, validated)
        if validated.selected:
            a_later_one_joined.set()
        return released

    monkeypatch.setattr(AsyncSchedule, "_join", joined)
    monkeypatch.setattr(AsyncSchedule, "_select_and_validate", counted)
    # Pipelines started beside a lone child of the best build on it, and their improvers wait for it to join rather
    # than queue; whether eight improvers then pile up behind the held first validation turned on which of the first
    # pipelines finished first (2 of 10 seeds, and seed 0 once on a loaded machine, never started a second one). Here
    # every pipeline takes its parent from the pool, so the improvers queue.
    monkeypatch.setattr(AsyncSchedule, "_building_on", lambda self, proposal: None)
    splits = sim.make_splits(seed=0, train=30, val=6, test=1)
    lm = sim.SimulatedLM(task_latency=0.01)
    # 16 in flight: improvers pile up behind the held first validation until eight wait.
    result = compile_sim(splits=splits, lm=lm, schedule="async", p=8, n=2, num_threads=16, max_metric_calls=400,
                         selection="merge", reflection_lm=sim.SimulatedLM(reflection_latency=0.05)).results
    beside_another = [size for already, size in starts if already]
    assert running["peak"] == widths.MAX_VALIDATIONS_IN_FLIGHT == 2
    assert beside_another, starts  # while the first was held, improvers piled up and a second one started
    assert min(beside_another) >= widths.SECOND_VALIDATION_MIN_IMPROVERS, starts
    assert lm.stats()["calls"]["task"] == result.total_metric_calls <= 400
    assert sum(step.metric_calls for step in result.steps) + 6 == result.total_metric_calls
    # Each window's metric calls are the rollouts that finished in it, whichever validation ends it.
    assert [step.metric_calls for step in result.steps] == [step.rollouts for step in result.steps]


class SecondReflectionHangs(sim.SimulatedLM):
    """A reflection LM whose first call returns once a second one has started, and whose second call does
    not return until the test lets it (at most a minute): both reflections are in flight together."""

    released = threading.Event()
    second_started = threading.Event()
    calls = 0
    lock = threading.Lock()

    def latency(self, kind):
        if kind == "reflection":
            with self.lock:
                type(self).calls += 1
                call = type(self).calls
            if call == 1:
                type(self).second_started.wait(timeout=10)
            else:
                type(self).second_started.set()
                type(self).released.wait(timeout=60)
        return 0.0

    @classmethod
    def reset(cls):
        cls.released, cls.second_started, cls.calls = threading.Event(), threading.Event(), 0


def run_with_the_second_reflection_hanging(tmp_path, seed, lm, reflection_lm, callback):
    """A 2x1 async run whose budget (the seed on |val| = 10, two screenings of 6, one validation) leaves
    one validation after both pipelines reflect; ``callback`` decides when the hanging reflection returns."""
    SecondReflectionHangs.reset()
    train, val, _ = sim.make_splits(seed=seed, train=20, val=10, test=1)
    try:
        result = compile_sim(splits=(train, val), lm=lm, reflection_lm=reflection_lm, p=2, n=1, num_threads=4,
                             max_metric_calls=32, schedule="async", seed=seed, gepa_kwargs={"callbacks": [callback]},
                             log_dir=str(tmp_path)).results
    finally:
        SecondReflectionHangs.released.set()
    return result, val


class ReleasedAtTheEnd(Heard):
    """Lets the hanging reflection return once the search has ended and waits until it has (and has been
    billed), so it bills its call after the run ended but before the run's result is read. Its thread then
    waits for the schedule's lock, which gepa's callbacks are told under, and ends after compile."""

    def __init__(self, reflection_lm):
        super().__init__()
        self.reflection_lm = reflection_lm

    def on_optimization_end(self, event):
        self.events.append(("on_optimization_end", event))
        self.heard_by_the_end = list(self.events)
        SecondReflectionHangs.released.set()
        deadline = time.perf_counter() + 10
        while self.reflection_lm.stats()["in_flight"]["reflection"] and time.perf_counter() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # DSPy bills the call once the LM returns it


@pytest.mark.parametrize("seed", [5, 6])
def test_a_run_does_not_wait_for_a_reflection_whose_child_no_budget_is_left_to_validate(tmp_path, seed):
    # Budget: the seed on |val| = 10, two pipelines' screenings (2 x 6), one validation (10). Both
    # pipelines reflect together; the first to start returns, the other hangs. On these seeds either
    # pipeline's child improves (which one reflects first is up to the threads) and takes the one
    # validation left; whatever the hanging reflection proposes could not be validated: the run must not
    # wait for it.
    lm, reflection_lm = sim.SimulatedLM(), SecondReflectionHangs()
    heard = ReleasedAtTheEnd(reflection_lm)
    started = time.perf_counter()
    result, _ = run_with_the_second_reflection_hanging(tmp_path, seed, lm, reflection_lm, heard)
    wall = time.perf_counter() - started
    assert wall < 30 and SecondReflectionHangs.calls == 2  # returned with the second reflection in flight
    assert len(result.candidates) == 2 and result.total_metric_calls == 32 - 3  # its child was never screened
    ended = [e for name, e in heard.events if name == "on_proposal_decided" and e["outcome"] == "no_proposal"]
    assert len(ended) == 1 and "ended before its reflection returned" in ended[0]["reason"]
    # The reflection returned to a run that had ended (before its result was read): no rollout, no event,
    # no record, no callback, and its call is not in the run's usage, which its last record tells as well.
    assert not threads_left_behind(wait_s=10)
    assert lm.stats()["calls"]["task"] == result.total_metric_calls
    assert heard.events == heard.heard_by_the_end and heard.events[-1][0] == "on_optimization_end"
    records = read_step_log(str(tmp_path))
    assert [r.step for r in records] == [s.step for s in result.steps]
    assert result.usage.lm_calls == result.lm_call_counts.calls == result.total_metric_calls + 1  # and one reflection
    assert result.lm_call_counts.abandoned == 1
    assert sum(step.lm_calls for step in result.steps) == result.usage.lm_calls  # the first has the seed's


class ReleasedAsTheLastValidationEnds(Heard):
    """Lets the hanging reflection return while the last validation's window ends, and waits until it has
    been billed: its step event then waits for the schedule's lock, which the search takes next to decide
    whether anything in flight can still count. Whichever gets the lock first, the call ended before the
    run did: it is the run's, and a step record must say so."""

    def on_iteration_end(self, event):
        self.events.append(("on_iteration_end", event))
        if event["proposal_accepted"] and not SecondReflectionHangs.released.is_set():
            ledger = dspy.settings.usage_tracker  # the run's: gepa's callbacks are told in the search's context
            billed = ledger.tally().billed
            SecondReflectionHangs.released.set()
            deadline = time.perf_counter() + 30
            while ledger.tally().billed == billed and time.perf_counter() < deadline:
                time.sleep(0.01)


@pytest.mark.parametrize("seed", [5, 6])
def test_a_reflection_billed_as_the_run_ends_is_in_its_last_step_record(tmp_path, seed):
    # The run of the test above, but the second reflection returns as the one validation left ends.
    priced = "openai/gpt-4o-mini"  # litellm knows its price: the records carry dollars
    result, _ = run_with_the_second_reflection_hanging(
        tmp_path, seed, sim.SimulatedLM(priced), SecondReflectionHangs(priced), ReleasedAsTheLastValidationEnds())
    assert SecondReflectionHangs.calls == 2 and len(result.candidates) == 2
    counts = result.lm_call_counts  # the call is counted once it ended: as the run's, or within a hair after it
    assert result.usage.lm_calls == counts.calls + counts.abandoned == result.total_metric_calls + 2
    assert sum(step.lm_calls for step in result.steps) == result.usage.lm_calls  # the first has the seed's
    assert result.steps[-1].cost_usd_total == pytest.approx(result.usage.cost_usd)
    assert [r.cost_usd_total for r in read_step_log(str(tmp_path))] == [s.cost_usd_total for s in result.steps]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_pipeline_started_while_a_candidate_is_validated_builds_on_it(seed):
    """Where each improvement builds on the last (the chain landscape), one proposal in flight never waits for a
    validation: the pipeline started beside it takes the candidate being validated as its parent, as dspy.GEPA's
    next step takes the candidate it has just validated. A pipeline that took its parent from the pool alone would
    start from the seed again and teach what the candidate in validation already knows: an improving child no
    validation can use (the sibling merge finds nothing new in it)."""
    heard = Heard()
    train, val, _ = sim.make_splits(seed=seed, train=30, val=12, test=1)
    chain = {"landscape": "chain", "task_latency": 0.01, "reflection_latency": 0.03}
    result = compile_sim(splits=(train, val), lm=sim.SimulatedLM(**chain), reflection_lm=sim.SimulatedLM(**chain),
                         schedule="async", p=1, n=1, selection="merge", use_merge=False, max_metric_calls=300,
                         seed=seed, gepa_kwargs={"callbacks": [heard]}).results
    # Improving children left unvalidated whose parent was behind the best candidate when they were decided (one of
    # several candidates tied for best is a parent gepa's Pareto sampling may give any pipeline).
    scores, stale = {0: result.val_aggregate_scores[0]}, []
    for name, event in heard.events:
        if name == "on_proposal_decided" and event["outcome"] == "validated":
            scores[event["candidate"]] = event["val_score"]
        elif name == "on_proposal_decided" and event["outcome"] in ("improved_not_selected", "merged"):
            stale += [event] if scores[event["parent"]] < max(scores.values()) else []
    assert len(result.candidates) >= 4 and not stale, [(e["parent"], e["outcome"], e["reason"]) for e in stale]
    # Each candidate is the child of one validated before it: the lineage is the chain itself.
    assert all(parents == [index - 1] for index, parents in enumerate(result.parents[1:], start=1)), result.parents


def test_a_child_is_screened_on_the_rest_of_its_minibatch_only_after_beating_its_parent_where_reflection_read():
    """Above one proposal at a time the default minibatch is 8 rows of which reflection reads 3: the parent is traced
    on those 3, the child screened on them, and only a child that beat its parent there is screened, beside its
    parent, on the other 5. A try that fails costs dspy.GEPA's 6 calls, and the budget stays exact."""
    heard, lm, reflection_lm = Heard(), sim.SimulatedLM(), sim.SimulatedLM()
    train, val, _ = sim.make_splits(seed=0, train=60, val=30, test=1)
    result = compile_sim(splits=(train, val), lm=lm, reflection_lm=reflection_lm, p=3, n=1, max_metric_calls=500,
                         use_merge=False, gepa_kwargs={"callbacks": [heard]}).results
    assert {step.minibatch_size for step in result.steps} == {8}
    decided = [e for name, e in heard.events if name == "on_proposal_decided" and e["proposal"] is not None
               and e["proposal"].tag == "reflective_mutation"]
    by_rows = {rows: [e for e in decided if len(e["proposal"].subsample_indices) == rows] for rows in (3, 8)}
    assert len(by_rows[3]) + len(by_rows[8]) == len(decided)
    assert by_rows[3] and by_rows[8]  # some children stopped at the first stage, some went on
    for event in by_rows[3]:  # stopped: not better than the parent on the rows reflection read
        proposal = event["proposal"]
        assert event["outcome"] == "not_improved"
        assert sum(proposal.subsample_scores_after) <= sum(proposal.subsample_scores_before)
        assert len(proposal.subsample_scores_before) == len(proposal.subsample_scores_after) == 3
    for event in by_rows[8]:  # went on: better on the first 3, then judged on all 8
        proposal = event["proposal"]
        before, after = proposal.subsample_scores_before, proposal.subsample_scores_after
        assert len(before) == len(after) == 8 and sum(after[:3]) > sum(before[:3])
        assert (event["outcome"] != "not_improved") == (sum(after) > sum(before))
    assert all(len(e["proposal"].subsample_indices) == 8 for e in decided if e["outcome"] != "not_improved")
    prompts = reflection_prompts(reflection_lm)
    assert prompts and all(prompt.count('"Feedback"') == 3 for prompt in prompts)  # what the parent was traced on
    assert lm.stats()["calls"]["task"] == result.total_metric_calls <= 500
    assert sum(step.metric_calls for step in result.steps) + len(val) == result.total_metric_calls


def test_a_child_that_is_already_another_candidate_is_not_screened():
    """A child whose text is a candidate in the pool or being validated, other than its own parent, ends its pipeline
    before its screening (its parent's first stage is all it cost): screening and merging it would spend calls to
    learn what the pool holds. Where each improvement builds on the last, a pipeline started from a candidate that
    has since been improved on often rewrites it into that improvement."""
    seed_text = sim.seed_instruction()
    better = seed_text + "\n" + "\n".join(rule.definition for rule in sim.task.RULES[:3])

    def proposer(candidate, reflective_dataset, components_to_update):  # the seed into `better`, the rest back
        return {name: better if candidate[name] == seed_text else seed_text for name in components_to_update}

    heard, lm = Heard(), sim.SimulatedLM()
    train, val, _ = sim.make_splits(seed=0, train=60, val=30, test=1)
    result = compile_sim(splits=(train, val), lm=lm, reflection_lm=None, instruction_proposer=proposer, p=3, n=1,
                         max_metric_calls=300, use_merge=False, gepa_kwargs={"callbacks": [heard]}).results
    instructions = [next(iter(c.named_predictors()))[1].signature.instructions for c in result.candidates]
    assert instructions == [seed_text, better]
    decided = [event for name, event in heard.events if name == "on_proposal_decided"]
    screened = [e["proposal"] for e in decided if e["proposal"] is not None]
    known = [e for e in decided if e["reason"] == "the child is a candidate already in the pool or being validated"]
    assert len(known) >= 10 and all(len(e["minibatch_ids"]) == 3 for e in known)
    # Screened: only the seed's children rewritten into `better` before it was known; none of `better`'s.
    assert screened and all(p.parent_program_ids == [0] and set(p.candidate.values()) == {better} for p in screened)
    assert lm.stats()["calls"]["task"] == result.total_metric_calls <= 300
