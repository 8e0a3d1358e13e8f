"""BatchedGEPA compiles each task program for a few steps through the real HTTP path (the latency server).

The server answers every task prompt by filling the declared output fields (its answers
are made for the synthetic rule task, so here they score 0) and every reflection by
returning the current instruction: enough to drive whole P×N steps — rollouts, metric
with feedback, reflective dataset, proposals, validation — through dspy.LM -> litellm ->
HTTP without any error, which is what these tests check.
"""

import pytest
from dspy_pxn.programs import hover, math_solver
from dspy_pxn.programs.data import load_hover, load_livebench_math
from dspy_pxn.programs.demo_corpus import write_claims_corpus
from dspy_pxn.programs.retrieval import build_index

from dspy_pxn.testing import LatencyServer
from tests.compiling import compile_sim
from tests.test_programs_helpers import require_data


@pytest.fixture(scope="module")
def server():
    with LatencyServer() as srv:
        yield srv


def compile_on(server, program, metric, train, val, budget):
    """A 2x1 compile of the program on the server's LMs, and the server's calls for it."""
    server.reset_stats()
    best, _ = compile_sim(program, (train, val), lm=server.lm("task"), reflection_lm=server.lm("reflection"),
                          metric=metric, p=2, n=1, max_metric_calls=budget, num_threads=4, warn_on_score_mismatch=False)
    return best, server.stats()["calls"]


def test_batched_gepa_compiles_the_math_solver(server):
    split = load_livebench_math(require_data("livebench_math"))
    # No metric given: the program's own (every ready-made program carries its metric).
    best, calls = compile_on(server, math_solver.MathSolver(), None, split.train[:6], split.val[:4], 30)
    result = best.detailed_results
    assert isinstance(best, math_solver.MathSolver) and best.metric is math_solver.metric
    # The default schedule (async at 2×1): at least two proposals screened, on an exact budget.
    assert sum(s.proposals for s in result.steps) >= 2 and result.total_metric_calls <= 30
    assert calls["task"] == result.total_metric_calls  # one LM call per rollout, every one through HTTP
    assert calls["reflection"] >= len(result.steps)
    assert best.solve.predict.signature.instructions.strip()


def test_batched_gepa_compiles_the_hover_agent(server, tmp_path):
    split = load_hover(require_data("hover/hover_dev_release_v1.1.json"))
    index = build_index(write_claims_corpus(split.train[:40], tmp_path / "corpus.jsonl"), tmp_path / "index")
    best, calls = compile_on(server, hover.HoverAgent(index), hover.metric, split.train[:6], split.val[:3], 27)
    result = best.detailed_results
    assert isinstance(best, hover.HoverAgent) and best.retriever is index
    assert sum(s.proposals for s in result.steps) >= 2 and result.total_metric_calls <= 27
    assert calls["task"] == 8 * result.total_metric_calls  # four hops of query writer + note taker
    assert calls["reflection"] >= len(result.steps)
    assert [name for name, _ in best.named_predictors()] == ["write_query.predict", "take_notes.predict"]
