"""The HoVer agent end to end (deterministic in-process LM, BM25 over a corpus built from HoVer claims) and its metric."""

import dspy
import pytest
from dspy.utils import DummyLM
from dspy_pxn.programs.data import load_hover
from dspy_pxn.programs.demo_corpus import claims_corpus, write_claims_corpus
from dspy_pxn.programs.hover import HopRecord, HoverAgent, metric, normalize_title, recall, score, unique_titles
from dspy_pxn.programs.retrieval import build_index

from tests.test_programs_helpers import require_data


@pytest.fixture(scope="module")
def split():
    return load_hover(require_data("hover/hover_dev_release_v1.1.json"))


@pytest.fixture(scope="module")
def index(split, tmp_path_factory):
    # No Wikipedia here: one document per supporting title of 80 training claims, generated now.
    directory = tmp_path_factory.mktemp("hover")
    return build_index(write_claims_corpus(split.train[:80], directory / "corpus.jsonl"), directory / "index")


def hop_answers(queries, noted):
    """Scripted LM replies in call order: query writer, then note taker, for each hop."""
    answers = []
    for query, (titles, notes) in zip(queries, noted):
        answers.append({"reasoning": "Next entity.", "query": query})
        answers.append({"reasoning": "Reading.", "new_notes": notes, "titles": titles})
    return answers


def test_demo_corpus_has_one_document_per_gold_title(split):
    docs = claims_corpus(split.train[:10])
    titles = [d["title"] for d in docs]
    assert titles == unique_titles(t for e in split.train[:10] for t in e.titles)
    assert all(d["text"].startswith(d["title"]) for d in docs)


def test_agent_runs_four_hops_of_two_calls_and_scores_recall(split, index):
    example = split.train[0]  # gold: Hoodlum (film), Lucky Luciano, Davina (R&B singer)
    assert example.titles == ["Hoodlum (film)", "Lucky Luciano", "Davina (R&B singer)"]
    queries = ["Lucky Luciano", "Hoodlum film", "zzz qqq", "Lucky Luciano crime boss"]
    noted = [("Lucky Luciano", "Luciano is considered the father of modern organized crime."),
             ("", "Andy Garcia starred in a 1997 drama."),
             ("", ""),
             ("Lucky Luciano", "")]
    lm = DummyLM(hop_answers(queries, noted))
    agent = HoverAgent(index, k=1)
    with dspy.context(lm=lm):
        pred = agent(claim=example.claim)
    assert len(lm.history) == 8
    assert [h.query for h in pred.hops] == queries
    assert [h.retrieved for h in pred.hops] == [("Lucky Luciano",), ("Hoodlum (film)",), (), ("Lucky Luciano",)]
    assert pred.titles == ["Lucky Luciano", "Hoodlum (film)"]  # order-preserving dedup across hops
    assert pred.notes == ["Luciano is considered the father of modern organized crime.",
                          "Andy Garcia starred in a 1997 drama."]
    # The second hop's note taker saw the first hop's notes.
    assert "father of modern organized crime" in lm.history[3]["messages"][-1]["content"]

    result = metric(example, pred)
    assert result.score == pytest.approx(2 / 3) == score(example, pred)
    assert 'Found: "Hoodlum (film)", "Lucky Luciano". Missing: "Davina (R&B singer)".' in result.feedback

    queries_fb = metric(example, pred, None, "write_query.predict", None).feedback
    assert 'Hop 3 query "zzz qqq" found no new supporting article.' in queries_fb
    assert "The trail was lost at hop 3" in queries_fb and "notes dropped" not in queries_fb

    notes_fb = metric(example, pred, None, "take_notes.predict", None).feedback
    assert 'Hop 1 notes kept "Lucky Luciano".' in notes_fb
    assert 'Hop 2 notes dropped "Hoodlum (film)"' in notes_fb and "lost the trail at hop 2" in notes_fb
    assert "Hop 3 query" not in notes_fb


def test_metric_names_the_hop_a_reflective_example_shows(split, index):
    example = split.train[0]
    pred = dspy.Prediction(titles=["Lucky Luciano"], hops=[
        HopRecord("Lucky Luciano", ("Lucky Luciano",), ("Lucky Luciano",), ("n1",), ()),
        HopRecord("x", (), (), (), ("n1",)),
    ])
    trace = [(None, {"claim": example.claim, "notes": ["n1"]}, dspy.Prediction(query="x"))]
    assert "(This example is hop 2.)" in metric(example, pred, None, "write_query.predict", trace).feedback


def test_all_found_and_nothing_recorded():
    gold = dspy.Example(claim="c", titles=["A", "B"]).with_inputs("claim")
    hops = [HopRecord("a", ("A", "X"), ("A",), ("A is x",), ()), HopRecord("b", ("B",), (), ("about B",), ("A is x",))]
    result = metric(gold, dspy.Prediction(titles=["A", "X", "B"], hops=hops))
    assert result.score == 1.0 and "All supporting articles were found by hop 2." in result.feedback
    assert 'Hop 2 notes kept "B"' in result.feedback  # mentioned in the notes counts as kept
    empty = metric(gold, dspy.Prediction(titles=[]))
    assert empty.score == 0.0 and "recorded no hops" in empty.feedback
    assert metric(gold, None).score == 0.0


def test_recall_normalizes_titles_and_keeps_gold_order():
    result = recall(["Davina (R&amp;B singer)", "Lucky_Luciano", "Hoodlum (film)"],
                    ["hoodlum (film)", "Lucky  Luciano", "Other", "Davina (R&B singer)"])
    assert result.found == ("Davina (R&amp;B singer)", "Lucky_Luciano", "Hoodlum (film)") and result.score == 1.0
    assert recall(["A", "a", "B"], ["b"]).found == ("B",) and recall(["A", "a", "B"], ["b"]).score == 0.5
    assert normalize_title("Crème_Brûlée") == normalize_title("crème  brûlée")
    assert unique_titles(["B", "A", "b", "A"]) == ["B", "A"]


def test_agent_arguments_and_optimizable_predictors(index):
    agent = HoverAgent(index)
    assert [name for name, _ in agent.named_predictors()] == ["write_query.predict", "take_notes.predict"]
    assert agent.deepcopy().retriever is index  # candidates share the (possibly huge) index
    assert agent.metric is metric  # BatchedGEPA uses the program's own metric when given none
    with pytest.raises(ValueError, match=r"HoverAgent\(k=...\) must be a positive int"):
        HoverAgent(index, k=0)
    with pytest.raises(ValueError, match=r"HoverAgent\(hops=...\) must be a positive int"):
        HoverAgent(index, hops="4")
    with pytest.raises(ValueError, match="no `titles`"):
        metric(dspy.Example(claim="c").with_inputs("claim"), dspy.Prediction(titles=[]))
