"""A run counts its LM calls in its ledger, fed at the LMs it reaches, not through a context-wide DSPy callback.

What must hold: every call of every LM the run reaches is counted exactly once (the context's
LM, a predictor's own LM, the reflection LM), a call from outside the run is not, two runs
sharing one LM each count their own, nothing is left on the user's LMs or the returned
program afterwards, and an LM the program does not hold is reported, not silently dropped.
"""

from __future__ import annotations

import contextvars
import copy
import logging
import pickle
import threading

import dspy
import pytest

from dspy_pxn import testing as sim
from dspy_pxn.ledger import feed
from dspy_pxn.ledger.ledger import RunLedger
from tests.compiling import compile_sim

# An untracked 2x2 run: its LM calls are the run's alone.
COUNTED = {"p": 2, "n": 2, "max_metric_calls": 120, "tracker": False}


def carries_the_callback(lm) -> bool:
    return any(c is feed.FEED for c in getattr(lm, "callbacks", []))


def calls(lm, kind="total") -> int:
    return lm.stats()["calls"][kind]


@pytest.mark.parametrize("schedule", ["steps", "async"])
def test_every_lm_the_run_reaches_is_counted_once_and_none_keeps_the_callback(splits, schedule):
    context_lm, own_lm, reflection_lm = sim.SimulatedLM(), sim.SimulatedLM(), sim.SimulatedLM()
    program = sim.seed_program()
    program.predict.lm = own_lm  # a predictor with its own LM: the context's LM answers nothing
    with dspy.context(lm=context_lm):
        best, _ = compile_sim(program, splits, reflection_lm=reflection_lm, schedule=schedule, **COUNTED)
    counts = best.detailed_results.lm_call_counts
    assert calls(context_lm) == 0
    # (an async run may return without reflections that could no longer count: ``abandoned``, in no other count)
    assert counts.calls + counts.abandoned == calls(own_lm) + calls(reflection_lm) > best.detailed_results.total_metric_calls
    assert counts.failures == 0
    leftovers = [lm for lm in (context_lm, own_lm, reflection_lm, *feed.reachable_lms(best))
                 if carries_the_callback(lm)]
    assert leftovers == []
    assert not dspy.settings.callbacks  # nothing context-wide was installed or left behind


def test_two_runs_sharing_one_lm_each_count_their_own_calls(splits):
    shared = sim.SimulatedLM(task_latency=0.002)
    reflections = [sim.SimulatedLM(), sim.SimulatedLM()]
    results: list = [None, None]

    def one(index: int) -> None:
        with dspy.context(lm=shared):
            results[index] = compile_sim(splits=splits, reflection_lm=reflections[index], seed=index, **COUNTED).results

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # One LM call per rollout of this one-predictor program, so each run's task calls are its metric calls.
    for result, reflection_lm in zip(results, reflections, strict=True):
        counts = result.lm_call_counts
        assert counts.calls + counts.abandoned == result.total_metric_calls + calls(reflection_lm)
    assert sum(r.total_metric_calls for r in results) == calls(shared)
    assert not carries_the_callback(shared)


def test_a_call_from_outside_the_run_reaches_no_ledger_of_the_run():
    lm, ledger = sim.SimulatedLM(), RunLedger()
    predict = dspy.Predict("question -> answer")
    predict.set_lm(lm)
    outside = threading.Thread(target=lambda: predict(question="Apply rule zorp to 1."))
    with feed.feeding(ledger, [lm]):
        assert carries_the_callback(lm)
        outside.start()  # a thread started without the run's context: the user's own work
        outside.join()
        predict(question="Apply rule zorp to 2.")
    assert (ledger.tally().calls, ledger.tally().billed, calls(lm)) == (1, 1, 2)
    assert not carries_the_callback(lm)


def test_copies_made_during_a_run_carry_one_callback_that_pickles_by_name_and_can_be_taken_off():
    lm, ledger = sim.SimulatedLM(), RunLedger()
    program = dspy.Predict("question -> answer")
    program.set_lm(lm)
    with feed.feeding(ledger, [program]):
        copied = program.deepcopy()
        assert copied.lm is not lm and carries_the_callback(copied.lm)
        assert pickle.loads(pickle.dumps(feed.FEED)) is feed.FEED
        assert copy.deepcopy(feed.FEED) is feed.FEED
        feed.leave_unfed(copied)
        feed.leave_unfed(program)  # still fed on by the run: it keeps the callback
        assert not carries_the_callback(copied.lm) and carries_the_callback(lm)
    assert not carries_the_callback(lm)


HIDDEN_LM = sim.SimulatedLM()


class HidesItsLM(dspy.Module):
    """Calls a module-level LM the program does not hold: the run cannot reach it."""

    def __init__(self):
        super().__init__()
        self.solve = sim.seed_program()

    def forward(self, question):
        with dspy.context(lm=HIDDEN_LM):
            return self.solve(question=question)


def test_calls_of_an_lm_the_program_does_not_hold_are_reported_with_the_fix(splits, caplog):
    reflection_lm = sim.SimulatedLM()
    with dspy.context(lm=sim.SimulatedLM()), caplog.at_level(logging.WARNING, logger="dspy_pxn"):
        best, _ = compile_sim(HidesItsLM(), splits, reflection_lm=reflection_lm, **COUNTED)
    result = best.detailed_results
    abandoned = result.lm_call_counts.abandoned  # reflections an async run returned without: in no other count
    assert result.lm_call_counts.calls + abandoned == calls(reflection_lm)
    assert result.usage.lm_calls + abandoned == calls(HIDDEN_LM) + calls(reflection_lm)
    warning = next(r.getMessage() for r in caplog.records if "does not hold" in r.getMessage())
    assert f"{calls(HIDDEN_LM)} LM calls" in warning and "set_lm" in warning


class AsksTwiceInParallel(dspy.Module):
    """Runs its predictor twice through dspy.Parallel, whose threads get DSPy's settings and nothing else."""

    def __init__(self):
        super().__init__()
        self.solve = sim.seed_program()

    def forward(self, question):
        first, _ = dspy.Parallel(num_threads=2, disable_progress_bar=True)(
            [(self.solve, {"question": question}), (self.solve, {"question": question})])
        return first


def test_calls_made_in_dspy_parallel_threads_inside_a_program_are_counted(splits, caplog):
    task_lm, reflection_lm = sim.SimulatedLM(), sim.SimulatedLM()
    with dspy.context(lm=task_lm), caplog.at_level(logging.WARNING, logger="dspy_pxn"):
        best, _ = compile_sim(AsksTwiceInParallel(), splits, reflection_lm=reflection_lm, **COUNTED)
    counts = best.detailed_results.lm_call_counts
    assert calls(task_lm) == 2 * best.detailed_results.total_metric_calls
    assert counts.calls + counts.abandoned == calls(task_lm) + calls(reflection_lm)
    assert not any("does not hold" in r.getMessage() for r in caplog.records)


def test_calls_a_run_returned_without_count_only_if_they_ended_before_it_did():
    ledger = RunLedger()
    billed = {"prompt_tokens": 10, "completion_tokens": 5}
    contexts = {name: contextvars.copy_context() for name in ("done before", "open at the end", "done after")}
    for name, context in contexts.items():  # each call in a thread (context) of its own, as pool tasks are
        context.run(ledger.call_started, name, "openai/sim")
    contexts["done before"].run(ledger.add_usage, "openai/sim", billed)
    contexts["done before"].run(ledger.call_ended, "done before", None)
    assert (ledger.tally().calls, ledger.tally().billed, ledger.tally().peak_in_flight) == (1, 1, 3)
    ledger.search_returned()
    contexts["done after"].run(ledger.add_usage, "openai/sim", billed)  # billed after the run returned: not its
    contexts["done after"].run(ledger.call_ended, "done after", None)
    contextvars.copy_context().run(ledger.call_started, "started after", "openai/sim")
    tally = ledger.tally()
    assert (tally.calls, tally.billed, tally.abandoned) == (1, 1, 3)
    assert (tally.counts.calls + tally.counts.abandoned, tally.usage.lm_calls) == (4, 1)
    contexts["open at the end"].run(ledger.call_ended, "open at the end", None)
    assert ledger.tally() == tally



def judged(judge_lm):
    """The simulated metric, plus an LLM judge's call on its own LM (as an LLM-as-judge metric makes)."""

    def metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
        with dspy.context(lm=judge_lm):
            dspy.Predict("question -> answer")(question="Apply rule zorp to 1.")
        return sim.metric(gold, pred, trace, pred_name, pred_trace)

    return metric


class OwnLMProposer:
    """A user's instruction proposer that asks its own LM, then proposes what the simulated reflection would."""

    def __init__(self, lm):
        self.lm = lm

    def __call__(self, candidate, reflective_dataset, components_to_update):
        with dspy.context(lm=self.lm):
            dspy.Predict("question -> answer")(question="Apply rule zorp to 2.")
        return {name: candidate[name] + " Be exact." for name in components_to_update}


@pytest.mark.parametrize("schedule", ["steps", "async"])
def test_a_judge_in_the_metric_and_a_proposers_own_lm_are_not_blamed_on_the_program(splits, caplog, schedule):
    """Only the program's own calls belong in the "LM the program does not hold" count; the judge's and the
    proposer's calls are billed (their dollars count), but they are not the program's."""
    judge_lm, proposer_lm, task_lm = sim.SimulatedLM(), sim.SimulatedLM(), sim.SimulatedLM()
    with dspy.context(lm=task_lm), caplog.at_level(logging.WARNING, logger="dspy_pxn"):
        best, _ = compile_sim(sim.seed_program(), splits, metric=judged(judge_lm), reflection_lm=sim.SimulatedLM(),
                              instruction_proposer=OwnLMProposer(proposer_lm), schedule=schedule, **COUNTED)
    assert calls(judge_lm) > 0 and calls(proposer_lm) > 0
    assert not any("does not hold" in r.getMessage() for r in caplog.records)
    assert best.detailed_results.usage.lm_calls >= calls(task_lm) + calls(judge_lm) + calls(proposer_lm) - (
        best.detailed_results.lm_call_counts.abandoned)
