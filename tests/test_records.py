"""Step records: what a step did in a user's words, and logs written before the two merges had their own names."""

import json

from dspy_pxn.engine.records import StepRecord


def record(**fields):
    base = dict(step=3, kind="reflective", p=4, n=4, width=16, distinct_parents=4, proposals=16, accepted=1,
                full_validation=True, new_candidates=[2], metric_calls=120, metric_calls_total=300, budget=600,
                best_val=0.5333, mean_val=0.4, pareto_front_size=2, wall_s=3.0, reflection_s=1.0,
                screening_s=2.0, validation_s=1.0, rollouts=120, rollout_failures=0, reflection_failures=0,
                worker_utilisation=0.9, num_workers=16)
    return StepRecord(**{**base, **fields})


def test_a_step_says_what_it_did():
    assert record(improved=5, sibling_merged=5).summary() == (
        "16 proposals screened (from 4 parents), 5 improved, 1 validated (a merge of 5), best val 0.533")
    assert record(proposals=1, distinct_parents=1, improved=0, accepted=0).summary() == (
        "1 proposal screened (from 1 parent), none validated, best val 0.533")
    # An async window in which only a validation finished: no parents drawn in it.
    assert record(width=0, distinct_parents=0, proposals=0, accepted=1).summary() == (
        "0 proposals screened, 1 validated, best val 0.533")
    assert "(a crossover)" in record(kind="crossover", proposals=1).summary()


def test_a_record_round_trips_and_a_line_without_the_bill_reads_with_its_defaults():
    now = record(improved=2, sibling_merged=2, sibling_merge_s=0.4, reflection_lm_calls=3, task_cost_usd=0.01)
    assert StepRecord.from_json(now.to_json()) == now
    bill = {f"{role}_{name}" for role in ("task", "reflection")
            for name in ("lm_calls", "prompt_tokens", "completion_tokens", "cost_usd")}
    before_the_bill = {k: v for k, v in json.loads(now.to_json()).items() if k not in bill}
    read = StepRecord.from_json(json.dumps(before_the_bill))
    assert (read.reflection_lm_calls, read.task_cost_usd, read.sibling_merged) == (0, None, 2)
