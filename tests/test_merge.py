"""Sibling merge: a step's improving children combined into one validated candidate.

The simulated reflection model learns one rule definition per reflection call; given a
merge prompt it combines the definitions the rewrites carry (dspy_pxn.testing.responder).
"""

import logging
import re
import time

import dspy
import pytest

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim

DEFINITION = re.compile(r"^([a-z]+)\(x\) = ", re.MULTILINE)


def rules_in(text: str) -> set[str]:
    return set(DEFINITION.findall(text))


def one_step(splits, selection, reflection_lm):
    train, val, _ = splits
    # Seed validation + one 4-wide step: 4x(3+3) screening + 2 validations = 12 + 24 + 24 = 60 metric calls.
    return BatchedGEPA(metric=sim.metric, p=4, n=1, max_metric_calls=60, num_threads=8, selection=selection,
                       schedule="steps",
                       reflection_lm=reflection_lm).compile(sim.seed_program(), trainset=train, valset=val)


def test_a_merge_carries_the_lessons_of_every_improving_child(task_lm, splits):
    reflection_lm = sim.SimulatedLM(reflection_error_rate=0.0)
    results = one_step(splits, "merge", reflection_lm).detailed_results
    (step,) = results.steps
    assert step.improved >= 2 and step.sibling_merged == step.improved and step.accepted == 1
    merged = results.candidates[-1].predict.signature.instructions
    assert len(rules_in(merged)) >= 2  # one reflection learns one rule; the merge holds several
    assert results.val_aggregate_scores[-1] > results.val_aggregate_scores[0]
    merge_prompts = [h for h in reflection_lm.history if "merged_instruction" in str(h["messages"])]
    assert len(merge_prompts) == 1
    prompt = str(merge_prompts[0]["messages"])
    # One block per distinct change (two children that learned the same rule the same way show as one).
    improved_text = prompt.split("improved_instructions")[-1]
    assert 1 <= improved_text.count("### Rewrite") <= step.improved and "Rule definition:" in prompt


def test_merge_and_best_validates_the_merge_beside_the_best_child(task_lm, splits):
    results = one_step(splits, "merge+best", sim.SimulatedLM(reflection_error_rate=0.0)).detailed_results
    (step,) = results.steps
    assert step.improved >= 2 and step.accepted == 2
    best_child, merged = (c.predict.signature.instructions for c in results.candidates[-2:])
    assert rules_in(best_child) < rules_in(merged)
    assert results.total_metric_calls <= 60


def test_a_lone_child_of_the_best_is_validated_without_a_merge_call(splits):
    train, val, _ = splits
    reflection_lm = sim.SimulatedLM(reflection_error_rate=0.0)
    with dspy.context(lm=sim.SimulatedLM()):
        # One step only (12 + 2x3 + 12): its one child was rewritten from the seed, the best there is.
        results = BatchedGEPA(metric=sim.metric, p=1, n=1, max_metric_calls=30, num_threads=4, selection="merge",
                              reflection_lm=reflection_lm).compile(sim.seed_program(), trainset=train,
                                                                   valset=val).detailed_results
    (step,) = results.steps
    assert step.sibling_merged == 0 and step.accepted == step.improved == 1
    assert not [h for h in reflection_lm.history if "merged_instruction" in str(h["messages"])]


def test_a_lone_child_of_an_older_candidate_is_merged_into_the_best(splits):
    from gepa.proposer.base import CandidateProposal
    from gepa.strategies.acceptance import StrictImprovementAcceptance

    from dspy_pxn.pools import ThreadWorkerPool
    from dspy_pxn.proposer.sibling_merge import SiblingMerge

    head = sim.seed_instruction()
    best, older = f"{head}\nzorp(x) = 3*x + 1", head  # candidate 1 knows zorp; its parent, the seed, does not
    child = f"{head}\nblick(x) = x*x - 2"  # rewritten from the seed: it learned blick only
    state = _state(older, best, scores=[0.0, 0.4])
    proposal = CandidateProposal(candidate={"predict": child}, parent_program_ids=[0],
                                 subsample_scores_before=[0, 0, 0], subsample_scores_after=[1, 0, 0])
    with ThreadWorkerPool(2) as pool:
        merge = SiblingMerge(pool, sim.SimulatedLM())
        (selected,) = merge.select([proposal], state, StrictImprovementAcceptance())
    assert rules_in(selected.candidate["predict"]) == {"zorp", "blick"}
    assert selected.parent_program_ids == [1, 0]


def test_the_merge_prompt_shows_lessons_not_inherited_text():
    from dspy_pxn.proposer.sibling_merge import changes, render_rewrites

    head = sim.seed_instruction()
    best = f"{head}\nzorp(x) = 3*x + 1"  # the pool's best has zorp right
    older = f"{head}\nzorp(x) = 3*x + 4"  # an older candidate with zorp garbled
    rewrites = [("0/3 -> 1/3", changes(older, f"{older}\nblick(x) = x*x - 2"), "- Rule definition: blick(x) = x*x - 2"),
                ("0/3 -> 1/3", changes(older, f"{older}\nfrim(x) = 2*x + 7"), "- Rule definition: frim(x) = 2*x + 7")]
    prompt = render_rewrites(rewrites)
    assert "3*x + 4" not in prompt and "+ blick(x) = x*x - 2" in prompt
    with dspy.context(lm=sim.SimulatedLM()):
        from dspy_pxn.proposer.sibling_merge import MergeImprovements

        merged = dspy.Predict(MergeImprovements)(current_instruction=best, improved_instructions=prompt)
    text = merged.merged_instruction
    assert "zorp(x) = 3*x + 1" in text and "3*x + 4" not in text  # two stale copies cannot outvote the fix
    assert rules_in(text) == {"zorp", "blick", "frim"}


def _state(*candidates: str, scores: list[float]):
    """gepa's state as a merge reads it: the pool, and each candidate's scores on one val example (its mean)."""
    return type("State", (), {"program_candidates": [{"predict": c} for c in candidates],
                              "program_full_scores_val_set": scores,
                              "prog_candidate_val_subscores": [{0: score} for score in scores]})()


def _proposal(child: str, parent: int, after: list[int]):
    from gepa.proposer.base import CandidateProposal

    return CandidateProposal(candidate={"predict": child}, parent_program_ids=[parent],
                             subsample_scores_before=[0, 0, 0], subsample_scores_after=after,
                             metadata={"proposal_id": f"p{id(child)}"})


def test_a_merge_prompt_shows_each_change_once_the_best_supported_first():
    from dspy_pxn.proposer.sibling_merge import MAX_LESSONS, lessons, render_rewrites

    rewrites = [("0/3 -> 2/3", "+ blick(x) = x*x - 2", "blick feedback"),   # the best rewrite, made once
                ("0/3 -> 1/3", "+ zorp(x) = 3*x + 1", "zorp feedback 1"),
                ("0/3 -> 1/3", "+ zorp(x) = 3*x + 4", "a garbled copy"),
                ("0/3 -> 1/3", "+ zorp(x) = 3*x + 1", "zorp feedback 2"),
                ("0/3 -> 1/3", "+ zorp(x) = 3*x + 1", "zorp feedback 3")]
    ranked = lessons(rewrites)
    assert [(lesson.change, lesson.support) for lesson in ranked] == [
        ("+ zorp(x) = 3*x + 1", 3), ("+ blick(x) = x*x - 2", 1), ("+ zorp(x) = 3*x + 4", 1)]
    assert ranked[0].feedback == "zorp feedback 1"  # the first (best) rewrite that made the change speaks for it
    prompt = render_rewrites(rewrites)
    assert prompt.count("### Rewrite") == 3 and "made by 3 of the 5 rewrites" in prompt
    many = [("0/3 -> 1/3", f"+ rule{i}(x) = x + {i}", "") for i in range(3 * MAX_LESSONS)]
    assert render_rewrites(many).count("### Rewrite") == MAX_LESSONS


def test_the_merge_keeps_the_change_most_rewrites_agree_on():
    from dspy_pxn.proposer.sibling_merge import MergeImprovements, render_rewrites

    head = sim.seed_instruction()
    rewrites = [("0/3 -> 1/3", "+ zorp(x) = 3*x + 4", ""), ("0/3 -> 1/3", "+ zorp(x) = 3*x + 1", ""),
                ("0/3 -> 1/3", "+ zorp(x) = 3*x + 1", "")]
    with dspy.context(lm=sim.SimulatedLM()):
        merged = dspy.Predict(MergeImprovements)(current_instruction=head,
                                                 improved_instructions=render_rewrites(rewrites))
    assert "zorp(x) = 3*x + 1" in merged.merged_instruction and "3*x + 4" not in merged.merged_instruction


def test_a_merge_that_adds_nothing_to_the_pool_gives_way_to_the_best_child():
    """A full instruction (the simulated model holds five rules) that the merge returns as it was: the
    merged candidate is already the pool's best, so the best child is validated instead of a duplicate."""
    from gepa.strategies.acceptance import StrictImprovementAcceptance

    from dspy_pxn.pools import ThreadWorkerPool
    from dspy_pxn.proposer.sibling_merge import SiblingMerge

    head = sim.seed_instruction()
    rules = [f"{r.name}(x) = {r.expr}" for r in sim.RULES[:5]]
    best = "\n".join([head, *rules])
    children = ["\n".join([head, *rules[1:], f"{r.name}(x) = {r.expr}"]) for r in sim.RULES[5:7]]  # evict, learn
    state = _state(head, best, scores=[0.0, 0.7])
    proposals = [_proposal(children[0], 1, [1, 1, 0]), _proposal(children[1], 1, [1, 0, 0])]
    with ThreadWorkerPool(2) as pool:
        reflection_lm = sim.SimulatedLM()
        selected = SiblingMerge(pool, reflection_lm).select(proposals, state, StrictImprovementAcceptance())
    assert [h for h in reflection_lm.history if "merged_instruction" in str(h["messages"])]  # the merge was asked
    assert len(selected) == 1 and selected[0].candidate == {"predict": children[0]}  # the best child, untouched
    assert selected[0].tag != "sibling_merge" and selected[0].parent_program_ids == [1]


def _long_instruction(sentences: int, seed: int = 0) -> str:
    import random

    rng = random.Random(seed)
    vocabulary = [f"{stem}{i}" for i, stem in enumerate(["rule", "number", "answer", "step", "check"] * 400)]
    return " ".join(" ".join(rng.choice(vocabulary) for _ in range(rng.randint(8, 20))).capitalize() + "."
                    for _ in range(sentences))


def test_the_changes_of_a_long_one_line_instruction_are_what_changed_and_take_milliseconds():
    """GEPA's instructions grow to thousands of characters on one line: the diff compares sentences (a run-on
    sentence in runs of words), not characters, and shows the merge the changed sentence, not both texts."""
    import time

    from dspy_pxn.proposer.sibling_merge import changes, render_rewrites

    before = _long_instruction(250)
    assert len(before) > 20_000 and "\n" not in before
    edited = before.split(". ")
    edited[120] = "Zorp maps x to 3*x + 1"
    after = ". ".join(edited) + " Always show the rule you applied."
    run_on = before.replace(".", "")  # no sentence ends at all
    run_on_after = run_on[:10_000] + " zorp(x) = 3*x + 1 " + run_on[10_000:]
    started = time.perf_counter()
    shown = changes(before, after)
    shown_run_on = changes(run_on, run_on_after)
    prompt = render_rewrites([("0/8 -> 1/8", shown, "feedback")] * 3)
    elapsed = time.perf_counter() - started
    assert elapsed < 0.25, elapsed  # a character diff (difflib.ndiff) of these took 2 s per rewrite
    assert "+ Zorp maps x to 3*x + 1." in shown and "+ Always show the rule you applied." in shown
    assert len(shown) < 600 and len(prompt) < 2_000
    assert "zorp(x) = 3*x + 1" in shown_run_on and len(shown_run_on) < 800


def test_the_changes_ignore_where_a_line_ends():
    from dspy_pxn.proposer.sibling_merge import changes

    assert changes("a\nzorp(x) = 3*x + 4", "a\nzorp(x) = 3*x + 4\nblick(x) = x*x - 2") == "+ blick(x) = x*x - 2"
    assert changes("Line one. Line two.\nBullet", "Line one. Line 2.\nBullet") == "- Line two.\n+ Line 2."


class AnswersMergesOnlyIn(sim.SimulatedLM):
    """The simulated reflection LM, answering a sibling merge only when asked in ``form`` ("dspy" or "plain"; None:
    never): any other merge prompt gets a reply no format can read."""

    def __init__(self, form: str | None, **kwargs):
        super().__init__(**kwargs)
        self.form = form
        self.unread_merges = 0

    def respond(self, messages):
        text = " ".join(str(m.get("content")) for m in messages)
        asked = "dspy" if "merged_instruction" in text else "plain" if "The improving rewrites:" in text else None
        if asked is not None and asked != self.form:
            self.unread_merges += 1
            self.last_unread_at = time.time()
            return "reflection", "Sure! Here is what I think about these rewrites: they all look good to me."
        return super().respond(messages)


def _two_rewrites():
    from dspy_pxn.proposer.sibling_merge import changes

    head = sim.seed_instruction()
    return head, [("0/3 -> 1/3", changes(head, f"{head}\nblick(x) = x*x - 2"), ""),
                  ("0/3 -> 1/3", changes(head, f"{head}\nfrim(x) = 2*x + 7"), "")]


def test_a_merge_reply_that_cannot_be_read_is_asked_again_in_the_other_format():
    from dspy_pxn.proposer.sibling_merge import MergeUnwritten, SiblingMerge

    head, rewrites = _two_rewrites()
    # DSPy's format is its chat adapter and, when that reply cannot be parsed, its JSON adapter: two calls.
    for formats, answers, unread in ((("dspy", "plain"), "plain", 2), (("plain", "dspy"), "dspy", 1)):
        lm = AnswersMergesOnlyIn(answers)
        merged = SiblingMerge(None, lm, formats).write("predict", {"predict": head}, rewrites, [])
        assert rules_in(merged) == {"blick", "frim"} and lm.unread_merges == unread
    with pytest.raises(MergeUnwritten, match="plain text: the reply holds no ``` block"):
        SiblingMerge(None, AnswersMergesOnlyIn(None)).write("predict", {"predict": head}, rewrites, [])


def test_a_reflection_lm_that_never_follows_the_merge_format_scores_as_one_proposal_at_a_time(caplog):
    """Its merges cannot be read in either format: the run stops merging and searches one proposal at a time,
    validating every improving child, and ends where the same run with p=1, n=1 ends (the step loop is
    deterministic for a seed; 8 seeds)."""
    train, val, _ = sim.make_splits(seed=0, train=40, val=20, test=1)
    finals: dict[str, list[float]] = {"wide": [], "one": []}
    for seed in range(8):
        for name, width in (("wide", {"p": 4, "n": 1}), ("one", {"p": 1, "n": 1})):
            lm = AnswersMergesOnlyIn(None)
            with dspy.context(lm=sim.SimulatedLM()), caplog.at_level(logging.WARNING, logger="dspy_pxn"):
                best = BatchedGEPA(metric=sim.metric, max_metric_calls=400, num_threads=8, reflection_lm=lm, seed=seed,
                                   reflection_minibatch_size=3, schedule="steps", **width).compile(
                    sim.seed_program(), trainset=train, valset=val)
            finals[name].append(max(best.detailed_results.val_aggregate_scores))
            if name == "wide":  # one merge, asked in each format (DSPy's chat and JSON, plain text), then no more
                assert lm.unread_merges == 3
                steps = best.detailed_results.steps  # 4 wide until the merge failed, then 1: every improver validated
                widths = [step.width for step in steps]
                assert widths == sorted(widths, reverse=True) and widths[-1] == 1 and widths.count(4) <= 3
                assert all(step.accepted == step.improved for step in steps)
    assert any("could not be read" in r.getMessage() and "one proposal at a time" in r.getMessage()
               for r in caplog.records)
    # Over 40 seeds the difference was -0.012 (se 0.014): the first, wide step's screenings and its one merge
    # attempt are what it costs. These 8 seeds (deterministic here): -0.031.
    wide, one = (sum(scores) / len(scores) for scores in finals.values())
    assert wide >= one - 0.04, finals


def test_the_asynchronous_schedule_goes_on_one_proposal_at_a_time_once_merges_cannot_be_read(splits):
    """After the unreadable merge no LM call overlaps a reflection: each proposal reflects alone, and starts from
    the pool as its predecessor's validation left it, as in dspy.GEPA's loop."""
    train, val, _ = splits
    task_lm, lm = sim.SimulatedLM(task_latency=0.01), AnswersMergesOnlyIn(None, reflection_latency=0.01)
    with dspy.context(lm=task_lm):
        result = BatchedGEPA(metric=sim.metric, p=4, n=1, max_metric_calls=300, num_threads=8, reflection_lm=lm,
                             reflection_minibatch_size=3, schedule="async", use_merge=False).compile(
            sim.seed_program(), trainset=train, valset=val).detailed_results
    assert lm.unread_merges in (3, 6)  # one merge in each format (two, where a second validation had begun one)
    after = sorted((call for call in (*task_lm.call_stats.timeline(), *lm.call_stats.timeline())
                    if call[1] > lm.last_unread_at), key=lambda call: call[1])
    reflections = [call for call in after if call[0] == "reflection"]
    assert len(reflections) >= 8 and result.total_metric_calls <= 300
    # The pipelines in flight when the merge failed (at most 4, beside the validations) reflect once each and
    # drain; from then on every proposal is alone in the run: in the second half of the reflections for certain.
    serial = [call for call in after if call[1] >= reflections[len(reflections) // 2][1]]
    overlapping = [(r, c) for r in serial if r[0] == "reflection" for c in serial
                   if c is not r and c[1] < r[2] and r[1] < c[2]]
    assert not overlapping, overlapping[:3]


def test_a_child_that_is_a_pool_candidates_very_text_is_not_validated():
    """A pipeline started from the seed while candidate 1 was validated learned what candidate 1 knows (where each
    improvement builds on the last, the same text): it beat only its own parent, and validating it would spend
    |val| on a duplicate."""
    from gepa.strategies.acceptance import StrictImprovementAcceptance

    from dspy_pxn.pools import ThreadWorkerPool
    from dspy_pxn.proposer.sibling_merge import SiblingMerge

    head = sim.seed_instruction()
    best = f"{head}\nzorp(x) = 3*x + 1"
    state = _state(head, best, scores=[0.0, 0.4])
    with ThreadWorkerPool(2) as pool:
        merge = SiblingMerge(pool, sim.SimulatedLM())
        assert merge.select([_proposal(best, 0, [1, 0, 0])], state, StrictImprovementAcceptance()) == []
        # The same lesson from the best itself (a model that returned its instruction as it was) is not a candidate.
        assert merge.select([_proposal(best, 1, [1, 0, 0])], state, StrictImprovementAcceptance()) == []


def test_a_child_of_a_candidate_tied_for_best_is_merged_into_its_own_parent():
    """Candidates 1 and 2 score alike (gepa's best is the earlier, 1); a lone child of 2 builds on 2, not on 1, so
    it is validated as it is: what 2 learned beyond 1 is not lost to the merge, and no merge prompt is needed."""
    from gepa.strategies.acceptance import StrictImprovementAcceptance

    from dspy_pxn.pools import ThreadWorkerPool
    from dspy_pxn.proposer.sibling_merge import SiblingMerge

    head = sim.seed_instruction()
    first, second = f"{head}\nzorp(x) = 3*x + 1", f"{head}\nzorp(x) = 3*x + 1\nfrim(x) = 2*x + 7"
    child = f"{second}\nblick(x) = x*x - 2"
    state = _state(head, first, second, scores=[0.0, 0.4, 0.4])
    reflection_lm = sim.SimulatedLM()
    with ThreadWorkerPool(2) as pool:
        proposal = _proposal(child, 2, [1, 0, 0])
        (selected,) = SiblingMerge(pool, reflection_lm).select([proposal], state, StrictImprovementAcceptance())
    assert selected is proposal and selected.candidate["predict"] == child and selected.parent_program_ids == [2]
    assert reflection_lm.stats()["calls"]["reflection"] == 0
