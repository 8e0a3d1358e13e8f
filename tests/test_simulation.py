"""Unit tests for the rule-arithmetic task and the pure `respond` logic (no HTTP)."""

from __future__ import annotations

import json
import re
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import dspy
import pytest
from dspy.adapters import ChatAdapter, JSONAdapter
from hypothesis import given, settings
from hypothesis import strategies as st

from dspy_pxn import testing as sim
from dspy_pxn.testing import BREADTH, CAPACITY, DEPTH, RULES, RULES_BY_NAME, Landscape, SimulatedLM, respond, responder
from dspy_pxn.testing.landscape import resolve_landscape

ZORP = RULES_BY_NAME["zorp"]
BLICK = RULES_BY_NAME["blick"]


# --------------------------------------------------------------------------- #
# Real DSPy prompts
# --------------------------------------------------------------------------- #


def task_messages(question: str, instruction: str | None = None, signature: str = "question -> answer",
                  adapter=None) -> tuple[list[dict], dspy.Signature]:
    sig = dspy.ChainOfThought(signature).predict.signature
    sig = sig.with_instructions(instruction if instruction is not None else sim.seed_instruction())
    return (adapter or ChatAdapter()).format(sig, [], {"question": question}), sig


def feedback_item(question: str, answer: str, feedback: str) -> dict:
    return {"Inputs": {"question": question}, "Generated Outputs": {"reasoning": "r", "answer": answer},
            "Feedback": feedback}


def reflection_messages(current: str, items: list[dict]) -> list[dict]:
    from dspy.teleprompt.gepa.instruction_proposal import InstructionProposer

    sig = InstructionProposer().propose.signature
    return JSONAdapter().format(sig, [], {"current_instruction": current, "examples_with_feedback": items})


def wrong_fb(rule: sim.Rule, x: int) -> dict:
    return feedback_item(f"Apply rule {rule.name} to {x}.", str(x),
                         f"Wrong: expected {rule.apply(x)}. Rule definition: {rule.definition}.")


def new_instruction(messages: list[dict], **kw) -> str:
    kind, content = respond(messages, **kw)
    assert kind == "reflection"
    return json.loads(content)["new_instruction"]


def definitions(instruction: str) -> list[str]:
    return [line for line in instruction.splitlines() if re.fullmatch(r"[a-z]+\(x\) = [0-9x*+\- ]+", line)]


# --------------------------------------------------------------------------- #
# Task data and metric
# --------------------------------------------------------------------------- #


def test_rule_table_shape():
    assert len(RULES) == 12
    assert len({r.name for r in RULES}) == 12
    weights = [r.weight for r in RULES]
    assert weights == sorted(weights, reverse=True) and weights[0] > 3 * weights[-1]
    assert ZORP.definition == "zorp(x) = 3*x + 1" and ZORP.apply(17) == 52
    # Rules are pairwise different functions on the task's domain.
    for a in RULES:
        for b in RULES:
            if a is not b:
                assert any(a.apply(x) != b.apply(x) for x in range(1, 51))


def test_make_examples_deterministic_and_consistent():
    a, b, c = sim.make_examples(40, seed=7), sim.make_examples(40, seed=7), sim.make_examples(40, seed=8)
    assert [e.toDict() for e in a] == [e.toDict() for e in b]
    assert [e.toDict() for e in a] != [e.toDict() for e in c]
    for ex in a:
        m = re.fullmatch(r"Apply rule (\w+) to (\d+)\.", ex.question)
        assert m and m.group(1) == ex.rule and 1 <= int(m.group(2)) <= 50
        assert ex.answer == str(RULES_BY_NAME[ex.rule].apply(int(m.group(2))))
        assert set(ex.inputs().keys()) == {"question"}


def test_make_examples_follow_zipf_weights():
    counts: dict[str, int] = {}
    for ex in sim.make_examples(3000, seed=1):
        counts[ex.rule] = counts.get(ex.rule, 0) + 1
    assert counts["zorp"] > counts["blick"] > counts["quax"] > counts.get("wemb", 0)


def test_make_splits():
    splits = sim.make_splits(seed=0, train=6, val=4, test=5)
    train, val, test = splits
    assert (len(train), len(val), len(test)) == (6, 4, 5)
    assert splits.train is train
    assert [e.toDict() for e in train] != [e.toDict() for e in sim.make_splits(seed=1, train=6).train]


def test_metric_feedback():
    gold = dspy.Example(question="Apply rule zorp to 17.", answer="52", rule="zorp").with_inputs("question")
    right = sim.metric(gold, dspy.Prediction(answer="52"))
    assert right.score == 1.0 and right.feedback == "Correct."
    assert sim.metric(gold, dspy.Prediction(answer=" 52 ")).score == 1.0
    wrong = sim.metric(gold, dspy.Prediction(answer="17"), None, "predict", None)
    assert wrong.score == 0.0
    assert wrong.feedback == "Wrong: expected 52. Rule definition: zorp(x) = 3*x + 1."
    assert sim.metric(gold, dspy.Prediction(answer="fifty-two")).score == 0.0
    assert sim.metric(gold, None).score == 0.0


def test_seed_instruction_has_no_definitions():
    assert "(x) =" not in sim.seed_instruction()


# --------------------------------------------------------------------------- #
# Task responses
# --------------------------------------------------------------------------- #


def test_task_correct_iff_definition_in_instruction():
    q = "Apply rule zorp to 17."
    messages, sig = task_messages(q)
    kind, content = respond(messages)
    assert kind == "task"
    parsed = ChatAdapter().parse(sig, content)
    assert set(parsed) == {"reasoning", "answer"} and parsed["answer"] != "52"

    messages, sig = task_messages(q, sim.seed_instruction() + "\n" + ZORP.definition)
    assert ChatAdapter().parse(sig, respond(messages)[1])["answer"] == "52"

    # Another rule's definition does not help.
    messages, sig = task_messages(q, sim.seed_instruction() + "\n" + BLICK.definition)
    assert ChatAdapter().parse(sig, respond(messages)[1])["answer"] != "52"


@pytest.mark.parametrize("garbled", ["zorp(x) = 3*x + 4", "zorp(x) = 3*x + 13", "zorp(x) = 3*x"])
def test_garbled_definition_gives_wrong_answer(garbled):
    messages, sig = task_messages("Apply rule zorp to 17.", sim.seed_instruction() + "\n" + garbled)
    assert ChatAdapter().parse(sig, respond(messages)[1])["answer"] != "52"


def test_every_rule_and_x_is_wrong_without_and_right_with_definition():
    for rule in RULES:
        for x in (1, 2, 3, 50):
            q = f"Apply rule {rule.name} to {x}."
            _, with_def = respond(task_messages(q, "Do it.\n" + rule.definition)[0])
            _, without = respond(task_messages(q, "Do it.")[0])
            assert f"[[ ## answer ## ]]\n{rule.apply(x)}\n" in with_def
            assert f"[[ ## answer ## ]]\n{rule.apply(x)}\n" not in without


def test_task_fills_declared_output_fields():
    messages, sig = task_messages("Apply rule zorp to 2.", ZORP.definition, "question -> answer, confidence")
    parsed = ChatAdapter().parse(sig, respond(messages)[1])
    assert set(parsed) == {"reasoning", "answer", "confidence"} and parsed["answer"] == "7"
    assert parsed["confidence"]

    sig = dspy.Predict("question -> answer").signature.with_instructions(ZORP.definition)
    content = respond(ChatAdapter().format(sig, [], {"question": "Apply rule zorp to 2."}))[1]
    assert "reasoning" not in content and ChatAdapter().parse(sig, content) == {"answer": "7"}


def test_task_in_json_adapter_format():
    messages, sig = task_messages("Apply rule zorp to 2.", ZORP.definition, adapter=JSONAdapter())
    kind, content = respond(messages)
    assert kind == "task" and JSONAdapter().parse(sig, content)["answer"] == "7"


def test_unparseable_prompts_never_raise():
    for messages in ([], [{"role": "user", "content": "hi"}], [{"role": "system"}],
                     [{"role": "user", "content": [{"type": "text", "text": "Apply rule zorp to 3."}]}],
                     [{"content": 5}], [{"role": "user", "content": "Apply rule nope to 3."}]):
        kind, content = respond(messages)
        assert kind == "task" and "[[ ## answer ## ]]" in content


@settings(max_examples=150, deadline=None)
@given(st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "x"]),
                                       "content": st.one_of(st.text(), st.none(), st.integers())}), max_size=4),
       st.floats(0, 1))
def test_respond_total_on_arbitrary_input(messages, rate):
    kind, content = respond(messages, reflection_error_rate=rate)
    assert kind in ("task", "reflection") and isinstance(content, str) and content


# --------------------------------------------------------------------------- #
# Reflection responses
# --------------------------------------------------------------------------- #


def test_reflection_adds_exactly_one_definition_and_keeps_text():
    current = "Apply the named rule.\nBe precise."
    messages = reflection_messages(current, [wrong_fb(ZORP, 17), wrong_fb(BLICK, 3)])
    kind, content = respond(messages, reflection_error_rate=0.0)
    assert kind == "reflection"
    new = json.loads(content)["new_instruction"]
    assert new.startswith(current)
    assert definitions(new) == [ZORP.definition]

    # The next call adds the next missing definition, not the one already present.
    new2 = new_instruction(reflection_messages(new, [wrong_fb(ZORP, 5), wrong_fb(BLICK, 3)]), reflection_error_rate=0)
    assert definitions(new2) == [ZORP.definition, BLICK.definition] and new2.startswith(current)


def test_gepa_plain_reflection_prompt_learns_a_definition():
    """gepa.optimize's own proposer (MLflow's GepaPromptOptimizer) sends its default prompt as plain text and reads
    the new instruction out of a ``` block: the model reflects on it as on a DSPy reflection prompt."""
    from gepa.strategies.instruction_proposal import InstructionProposalSignature

    records = [{"inputs": {"question": "Apply rule zorp to 4."}, "outputs": "4", "trace": [{"name": "Predict",
                "inputs": {"question": "[[ ## question ## ]]\nApply rule zorp to 4."}}],
                "rationales": {"rule_match": wrong_fb(ZORP, 4)["Feedback"]}}]
    prompt = InstructionProposalSignature.prompt_renderer(
        {"current_instruction_doc": "Go.\n" + BLICK.definition, "dataset_with_feedback": records})
    kind, content = respond([{"role": "user", "content": prompt}], reflection_error_rate=0.0)
    assert kind == "reflection"
    new = InstructionProposalSignature.output_extractor(content)["new_instruction"]
    assert new == "Go.\n" + BLICK.definition + "\n" + ZORP.definition


def test_reflection_parses_through_json_adapter():
    from dspy.teleprompt.gepa.instruction_proposal import InstructionProposer

    sig = InstructionProposer().propose.signature
    content = respond(reflection_messages("Go.", [wrong_fb(ZORP, 1)]), reflection_error_rate=0.0)[1]
    assert JSONAdapter().parse(sig, content) == {"new_instruction": "Go.\n" + ZORP.definition}


def test_reflection_respects_capacity_dropping_oldest():
    instruction = "Base text."
    for rule in RULES[:CAPACITY]:
        instruction = new_instruction(reflection_messages(instruction, [wrong_fb(rule, 3)]), reflection_error_rate=0)
    assert definitions(instruction) == [r.definition for r in RULES[:CAPACITY]]
    full = new_instruction(reflection_messages(instruction, [wrong_fb(RULES[CAPACITY], 3)]), reflection_error_rate=0)
    assert definitions(full) == [r.definition for r in RULES[1 : CAPACITY + 1]]
    assert full.startswith("Base text.")


def test_reflection_without_new_definition_keeps_instruction():
    current = "Go.\n" + ZORP.definition
    assert new_instruction(reflection_messages(current, [wrong_fb(ZORP, 4)])) == current
    no_feedback = [feedback_item("Apply rule zorp to 4.", "13", "Correct.")]
    assert new_instruction(reflection_messages("Go.", no_feedback)) == "Go."


def test_reflection_corrects_garbled_definition_in_place():
    current = "Go.\nzorp(x) = 3*x + 4\n" + BLICK.definition
    new = new_instruction(reflection_messages(current, [wrong_fb(ZORP, 4)]), reflection_error_rate=0)
    assert definitions(new) == [BLICK.definition, ZORP.definition]


def test_compress_request_drops_oldest_definitions():
    from dspy.teleprompt.gepa.instruction_proposal import InstructionProposer

    instruction = "Go.\n" + "\n".join(r.definition for r in RULES[:CAPACITY])
    limit = len(instruction) - 5
    proposer = InstructionProposer(max_chars=limit)
    with dspy.context(lm=SimulatedLM(reflection_error_rate=0.0)):
        out = proposer({"p": instruction}, {"p": [wrong_fb(RULES[CAPACITY], 2)]}, ["p"])["p"]
    assert len(out) <= limit and out.startswith("Go.")
    assert definitions(out) == [r.definition for r in RULES[2 : CAPACITY + 1]]


def test_reflection_is_deterministic():
    messages = reflection_messages("Go.", [wrong_fb(ZORP, 9), wrong_fb(BLICK, 2)])
    outs = {respond(messages)[1] for _ in range(5)}
    assert len(outs) == 1


def test_garble_rate_roughly_honoured():
    def garbled(rate: float, n: int = 400) -> float:
        bad = 0
        for i in range(n):
            rule = RULES[i % len(RULES)]
            new = new_instruction(reflection_messages("Go.", [wrong_fb(rule, 1 + i % 50)]), reflection_error_rate=rate)
            (added,) = definitions(new)
            assert added.startswith(f"{rule.name}(x) = ")
            bad += added != rule.definition
        return bad / n

    assert 0.3 <= garbled(sim.DEFAULT_REFLECTION_ERROR_RATE) <= 0.5
    assert garbled(0.0, 50) == 0.0 and garbled(1.0, 50) == 1.0


def test_module_default_error_rate_is_overridable(monkeypatch):
    messages = reflection_messages("Go.", [wrong_fb(ZORP, 9)])
    monkeypatch.setattr(responder, "DEFAULT_REFLECTION_ERROR_RATE", 1.0)
    assert definitions(new_instruction(messages)) != [ZORP.definition]
    monkeypatch.setattr(responder, "DEFAULT_REFLECTION_ERROR_RATE", 0.0)
    assert definitions(new_instruction(messages)) == [ZORP.definition]


def test_garbled_reflection_makes_task_wrong():
    for i in range(60):
        new = new_instruction(reflection_messages("Go.", [wrong_fb(ZORP, i + 1)]))
        if definitions(new) != [ZORP.definition]:
            break
    else:
        pytest.fail("no garbled rewrite in 60 prompts")
    messages, sig = task_messages("Apply rule zorp to 17.", new)
    assert ChatAdapter().parse(sig, respond(messages)[1])["answer"] != "52"


# --------------------------------------------------------------------------- #
# SimulatedLM (in-process)
# --------------------------------------------------------------------------- #


def test_simulated_lm_runs_chain_of_thought_without_deprecation():
    lm = SimulatedLM()
    cot = dspy.ChainOfThought("question -> answer")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        with dspy.context(lm=lm):
            assert cot(question="Apply rule zorp to 17.").answer != "52"
            cot.predict.signature = cot.predict.signature.with_instructions("Go.\n" + ZORP.definition)
            assert cot(question="Apply rule zorp to 17.").answer == "52"
            cot(question="Apply rule zorp to 17.")  # uncached: still counted
    stats = lm.stats()
    assert stats["calls"]["task"] == 3 and stats["calls"]["reflection"] == 0
    lm.reset_stats()
    assert lm.stats()["calls"]["total"] == 0


def test_simulated_lm_configure_and_reflection_proposer():
    from dspy.teleprompt.gepa.instruction_proposal import InstructionProposer

    lm = SimulatedLM(reflection_error_rate=0.0)
    with dspy.context(lm=lm):
        out = InstructionProposer()({"predict": "Go."}, {"predict": [wrong_fb(ZORP, 3)]}, ["predict"])
    assert out == {"predict": "Go.\n" + ZORP.definition}
    assert lm.stats()["calls"]["reflection"] == 1

    dspy.settings.configure(lm=SimulatedLM())
    try:
        assert dspy.ChainOfThought("question -> answer")(question="Apply rule zorp to 1.").answer == "1"
    finally:
        dspy.settings.configure(lm=None)


def test_simulated_lm_latency_and_max_in_flight():
    lm = SimulatedLM(task_latency=0.2)
    cot = dspy.ChainOfThought("question -> answer")

    def call(i: int) -> str:
        with dspy.context(lm=lm):
            return cot(question=f"Apply rule zorp to {i}.").answer

    start = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(call, range(1, 9)))
    elapsed = time.perf_counter() - start
    assert answers == [str(i) for i in range(1, 9)]
    stats = lm.stats()
    assert stats["calls"]["task"] == 8 and stats["in_flight"]["total"] == 0
    assert stats["max_in_flight"]["task"] >= 4 and elapsed < 8 * 0.2 * 0.75


@pytest.mark.filterwarnings("ignore:Passing OpenAI-style message:DeprecationWarning")
def test_simulated_lm_copies_share_stats_and_async_works():
    import asyncio

    lm = SimulatedLM()
    copy = lm.copy(temperature=0.5)
    assert copy.call_stats is lm.call_stats and copy._engine_spec.owner is copy
    messages, _ = task_messages("Apply rule zorp to 2.", ZORP.definition)
    assert "[[ ## answer ## ]]\n7" in copy(messages=messages)[0]
    assert "[[ ## answer ## ]]\n7" in asyncio.run(lm.acall(messages=messages))[0]
    assert lm.stats()["calls"]["task"] == 2
    raw = lm.forward(messages=messages)
    assert raw["choices"][0]["message"]["content"].startswith("[[ ## reasoning ## ]]")
    assert raw["usage"]["total_tokens"] == raw["usage"]["prompt_tokens"] + raw["usage"]["completion_tokens"]


def test_subclass_forward_override_is_honoured():
    class Spy(SimulatedLM):
        seen: list = []

        def forward(self, prompt=None, messages=None, **kwargs):
            self.seen.append(messages)
            return super().forward(prompt=prompt, messages=messages, **kwargs)

    class Refuse(SimulatedLM):
        def forward(self, *args, **kwargs):
            raise AssertionError("called")

    spy = Spy()
    with dspy.context(lm=spy):
        assert cot_answer("Apply rule zorp to 4.", ZORP.definition) == "13"
    assert len(Spy.seen) == 1 and spy.stats()["calls"]["task"] == 1
    with dspy.context(lm=Refuse()), pytest.raises(Exception, match="called"):
        cot_answer("Apply rule zorp to 4.", ZORP.definition)


def cot_answer(question: str, instruction: str) -> str:
    cot = dspy.ChainOfThought("question -> answer")
    cot.predict.signature = cot.predict.signature.with_instructions(instruction)
    return cot(question=question).answer


def test_call_stats_counts_concurrency():
    stats = sim.CallStats()
    barrier = threading.Barrier(5)

    def work():
        with stats.track("reflection"):
            barrier.wait(timeout=5)

    threads = [threading.Thread(target=work) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = stats.snapshot()
    assert snap["calls"]["reflection"] == 5 and snap["max_in_flight"]["reflection"] == 5
    assert snap["max_in_flight"]["total"] == 5 and snap["in_flight"]["total"] == 0


# --------------------------------------------------------------------------- #
# Landscapes
# --------------------------------------------------------------------------- #

def test_landscape_presets_and_resolution():
    assert DEPTH == Landscape() and (DEPTH.learn_per_call, DEPTH.capacity) == (1, CAPACITY) and not DEPTH.noisy
    assert BREADTH.learn_per_call > 1 and BREADTH.capacity > CAPACITY and BREADTH.noisy
    assert resolve_landscape(None) is DEPTH and resolve_landscape("Breadth") is BREADTH
    assert resolve_landscape(BREADTH.to_json()) == BREADTH
    custom = Landscape(name="x", learn_per_call=2, capacity=6, error_rate=0.1, slip_rate=0.05)
    assert resolve_landscape(custom.to_json()) == custom
    for bad in ("shallow", '{"name": "x", "width": 3}'):
        with pytest.raises(ValueError):
            resolve_landscape(bad)
    with pytest.raises(ValueError, match="slip_rate"):
        Landscape(slip_rate=1.5)
    assert SimulatedLM().landscape is DEPTH and SimulatedLM(landscape="breadth").landscape is BREADTH


def test_breadth_reflection_learns_several_definitions_per_call():
    items = [wrong_fb(ZORP, 2), wrong_fb(ZORP, 3), wrong_fb(BLICK, 5), wrong_fb(RULES[2], 1), wrong_fb(RULES[3], 1)]
    new = new_instruction(reflection_messages("Go.", items), reflection_error_rate=0.0, landscape=BREADTH)
    # The first three distinct rules of the feedback, in feedback order, each once.
    assert definitions(new) == [ZORP.definition, BLICK.definition, RULES[2].definition]
    # The next call takes the next ones the instruction lacks; DEPTH would take one.
    again = new_instruction(reflection_messages(new, items), reflection_error_rate=0.0, landscape=BREADTH)
    assert definitions(again) == [*definitions(new), RULES[3].definition]
    assert len(definitions(new_instruction(reflection_messages("Go.", items), reflection_error_rate=0.0))) == 1


def test_breadth_capacity_evicts_oldest():
    instruction = "Base.\n" + "\n".join(r.definition for r in RULES[: BREADTH.capacity])
    new = new_instruction(reflection_messages(instruction, [wrong_fb(r, 2) for r in RULES[8:11]]),
                          reflection_error_rate=0.0, landscape=BREADTH)
    assert definitions(new) == [r.definition for r in RULES[3 : BREADTH.capacity]] + [r.definition for r in RULES[8:11]]
    assert len(definitions(new)) == BREADTH.capacity and new.startswith("Base.")


def test_breadth_copies_each_definition_wrong_independently():
    garbled, mixed, n = 0, 0, 150
    for i in range(n):
        rules = [RULES[(i + k) % 12] for k in range(3)]
        new = new_instruction(reflection_messages("Go.", [wrong_fb(r, 1 + i % 50) for r in rules]), landscape=BREADTH)
        wrong = [d != r.definition for d, r in zip(definitions(new), rules, strict=True)]
        garbled += sum(wrong)
        mixed += 0 < sum(wrong) < 3
    rate = garbled / (3 * n)
    assert abs(rate - sim.DEFAULT_REFLECTION_ERROR_RATE) < 0.08, rate
    # Independent draws at 0.4: P(mixed) = 1 - 0.6^3 - 0.4^3 = 0.72; one shared draw would give 0.
    assert mixed / n > 0.55, mixed / n


def task_answer(question: str, instruction: str, landscape: Landscape, adapter=None) -> str:
    messages, sig = task_messages(question, instruction, adapter=adapter)
    return (adapter or ChatAdapter()).parse(sig, respond(messages, landscape=landscape)[1])["answer"]


def noise_rates(landscape: Landscape, trials: int = 600) -> tuple[float, float]:
    """(share wrong when the instruction knows the rule, share right when it does not)."""
    slips = guesses = 0
    for i in range(trials):
        rule, x = RULES[i % 12], 1 + (i * 7) % 50
        head = f"Go. Variant {i // 12}."
        q = f"Apply rule {rule.name} to {x}."
        slips += task_answer(q, f"{head}\n{rule.definition}", landscape) != str(rule.apply(x))
        guesses += task_answer(q, head, landscape) == str(rule.apply(x))
    return slips / trials, guesses / trials


def test_breadth_answers_are_noisy_at_the_landscape_rates():
    slip, guess = noise_rates(BREADTH)
    # 600 Bernoulli(0.15) trials: σ ≈ 0.015, so ±0.05 is over 3σ.
    assert abs(slip - BREADTH.slip_rate) < 0.05 and abs(guess - BREADTH.guess_rate) < 0.05, (slip, guess)
    assert noise_rates(DEPTH, 120) == (0.0, 0.0)


def test_answer_noise_is_fixed_by_instruction_and_question():
    instruction = "Go.\n" + "\n".join(r.definition for r in RULES[:8])
    edited = instruction.replace("Go.", "Go, carefully.")
    questions = [f"Apply rule {r.name} to {x}." for r in RULES[:8] for x in range(1, 21)]
    first = [task_answer(q, instruction, BREADTH) for q in questions]
    # The same candidate on the same example: the same answer, every time and in either adapter.
    assert first == [task_answer(q, instruction, BREADTH) for q in questions]
    assert first == [task_answer(q, instruction, BREADTH, JSONAdapter()) for q in questions]
    # An edit that changes no definition re-draws the luck: other examples go wrong.
    right = [a == str(RULES_BY_NAME[q.split()[2]].apply(int(q.split()[4][:-1]))) for q, a in zip(questions, first)]
    right_edited = [task_answer(q, edited, BREADTH) == str(RULES_BY_NAME[q.split()[2]].apply(int(q.split()[4][:-1])))
                    for q in questions]
    assert right != right_edited and 0.7 < sum(right) / len(right) < 0.95


def test_breadth_scores_are_stable_per_candidate_and_noisy_in_expectation():
    """What lets adaptive selection overfit val: a candidate's val score is a fixed number, its own luck."""
    val = sim.make_splits(seed=0).val
    program = sim.seed_program()
    program.predict.signature = program.predict.signature.with_instructions(
        "Go.\n" + "\n".join(r.definition for r in RULES[: BREADTH.capacity]))
    lm = SimulatedLM(landscape=BREADTH)

    def evaluate(data):
        with dspy.context(lm=lm):
            return dspy.Evaluate(devset=data, metric=sim.score, num_threads=4, display_progress=False)(program).score

    assert evaluate(val) == evaluate(val)
    big = sim.make_examples(1000, seed=99)
    with dspy.context(lm=SimulatedLM()):  # DEPTH: no noise; its score is the rules' coverage
        exact = dspy.Evaluate(devset=big, metric=sim.score, num_threads=4, display_progress=False)(program).score
    noisy = evaluate(big)
    # E[score] = coverage * (1 - slip) + (1 - coverage) * guess.
    expected = exact * (1 - BREADTH.slip_rate) + (100 - exact) * BREADTH.guess_rate
    assert abs(noisy - expected) < 4, (noisy, expected)


# --------------------------------------------------------------------------- #
# Sibling merge
# --------------------------------------------------------------------------- #


class MergeInstructions(dspy.Signature):
    """Combine the improving rewrites of the current instruction into one instruction that keeps what each learned."""

    current_instruction: str = dspy.InputField(desc="the instruction the rewrites started from")
    improved_instructions: str = dspy.InputField(desc="each improving rewrite and the feedback that led to it")
    merged_instruction: str = dspy.OutputField(desc="one instruction combining them")


def rewrite_blocks(rewrites: list[str], feedback: list[str] | None = None) -> str:
    feedback = feedback or [f"Wrong: expected 1. Rule definition: {RULES[11].definition}."] * len(rewrites)
    return "\n\n".join(f"### Rewrite {i + 1} (minibatch 0/3 -> 2/3)\n{text}\nFeedback that led to it:\n{fb}"
                       for i, (text, fb) in enumerate(zip(rewrites, feedback, strict=True)))


def merged(current: str, rewrites: list[str], landscape: Landscape = DEPTH, adapter=None,
           feedback: list[str] | None = None, **lm_kw) -> str:
    lm = SimulatedLM(landscape=landscape, **lm_kw)
    with dspy.context(lm=lm, adapter=adapter or ChatAdapter()):
        out = dspy.Predict(MergeInstructions)(current_instruction=current,
                                              improved_instructions=rewrite_blocks(rewrites, feedback))
    assert lm.stats()["calls"] == {"task": 0, "reflection": 1, "total": 1}
    return out.merged_instruction


def defs_of(*rules: sim.Rule) -> str:
    return "\n".join(r.definition for r in rules)


ADAPTERS = pytest.mark.parametrize("adapter", [ChatAdapter(), JSONAdapter()], ids=["chat", "json"])
LANDSCAPES = pytest.mark.parametrize("landscape", [DEPTH, BREADTH], ids=["depth", "breadth"])


@ADAPTERS
@LANDSCAPES
def test_merge_takes_the_union_of_the_rewrites_current_first(landscape, adapter):
    r = RULES
    current = f"Apply the rule.\nBe exact.\n{defs_of(r[0])}"
    rewrites = [f"Apply the rule.\nBe exact.\n{defs_of(r[0], r[1])}",
                f"Apply the rule.\nBe exact.\n{defs_of(r[0], r[2])}",
                f"Apply the rule.\nBe exact.\n{defs_of(r[0], r[1], r[3])}"]
    out = merged(current, rewrites, landscape, adapter)
    assert out.startswith("Apply the rule.\nBe exact.\n")
    assert definitions(out) == [r[0].definition, r[1].definition, r[2].definition, r[3].definition]


@ADAPTERS
@LANDSCAPES
def test_merge_enforces_the_landscape_capacity(landscape, adapter):
    r = RULES
    current = "Go.\n" + defs_of(*r[:4])
    rewrites = ["Go.\n" + defs_of(*r[:4], r[4], r[5]), "Go.\n" + defs_of(*r[:4], r[6])]
    union = [x.definition for x in r[:7]]
    # DEPTH holds 5 of the 7 (the current's four, then the first-read new one); BREADTH holds all 7.
    assert definitions(merged(current, rewrites, landscape, adapter)) == union[:landscape.capacity]


@ADAPTERS
@LANDSCAPES
def test_merge_learns_nothing_from_feedback_and_copies_without_error(landscape, adapter):
    current = "Go.\n" + defs_of(ZORP)
    rewrites = ["Go.\n" + defs_of(ZORP, BLICK)]
    feedback = ["Wrong: expected 9. Rule definition: frim(x) = 2*x + 7.\nfrim(x) = 2*x + 7"]
    # A reflection that always garbles still merges verbatim: the merge copies, it does not learn.
    out = merged(current, rewrites, landscape, adapter, feedback, reflection_error_rate=1.0)
    assert definitions(out) == [ZORP.definition, BLICK.definition]


@ADAPTERS
def test_merge_resolves_disagreement_by_majority_then_first(adapter):
    garbled_zorp, other_zorp = "zorp(x) = 3*x + 4", "zorp(x) = 3*x + 2"
    current = "Go.\n" + garbled_zorp
    # Two rewrites corrected zorp, one kept the garbled copy: the majority's version wins.
    majority = ["Go.\n" + ZORP.definition, "Go.\n" + garbled_zorp, "Go.\n" + ZORP.definition]
    assert definitions(merged(current, majority, adapter=adapter)) == [ZORP.definition]
    # One vote each: the first rewrite's version.
    tie = ["Go.\n" + other_zorp, "Go.\n" + ZORP.definition]
    assert definitions(merged(current, tie, adapter=adapter)) == [other_zorp]
    # A rule no rewrite mentions (blick, evicted by the rewrite) keeps the current's version and place.
    frim = RULES_BY_NAME["frim"]
    kept = merged("Go.\n" + defs_of(BLICK) + "\n" + garbled_zorp, ["Go.\n" + garbled_zorp + "\n" + frim.definition],
                  adapter=adapter)
    assert definitions(kept) == [BLICK.definition, garbled_zorp, frim.definition]


def test_merged_instruction_is_what_the_task_model_reads():
    """The merge of two rewrites that each learned one rule answers both rules' questions."""
    out = merged("Go.", ["Go.\n" + ZORP.definition, "Go.\n" + BLICK.definition])
    assert cot_answer_sim("Apply rule zorp to 4.", out) == "13" and cot_answer_sim("Apply rule blick to 4.", out) == "14"


def cot_answer_sim(question: str, instruction: str) -> str:
    with dspy.context(lm=SimulatedLM()):
        return cot_answer(question, instruction)


def test_merge_reads_rewrites_however_they_are_split():
    from dspy_pxn.testing.responder import _rewrite_texts, merge_instructions

    assert _rewrite_texts("Go.\nzorp(x) = 3*x + 1") == ["Go.\nzorp(x) = 3*x + 1"]
    assert _rewrite_texts(json.dumps(["A.\n" + ZORP.definition, "B.\n" + BLICK.definition])) == [
        "A.\n" + ZORP.definition, "B.\n" + BLICK.definition]
    blocks = rewrite_blocks(["A.\n" + ZORP.definition, "B."])
    assert _rewrite_texts(blocks) == ["A.\n" + ZORP.definition, "B."]
    assert merge_instructions("", [], capacity=5) == sim.seed_instruction()
    assert merge_instructions("Go.", ["Go."], capacity=5) == "Go."


def test_merge_prompt_is_a_reflection_call_that_never_raises():
    system = "Your output fields are:\n1. `merged_instruction` (str):\nAll interactions"
    for user in ("", "[[ ## improved_instructions ## ]]\n[not json", "[[ ## current_instruction ## ]]\n"):
        kind, content = respond([{"role": "system", "content": system}, {"role": "user", "content": user}])
        assert kind == "reflection" and "[[ ## merged_instruction ## ]]" in content
