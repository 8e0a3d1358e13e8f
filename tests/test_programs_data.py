"""Split recipes and data loading for the task programs (offline; the online path with a stand-in hub)."""

import json
import sys
import types

import pytest
from dspy_pxn.programs import data
from dspy_pxn.programs.data import DataNotFoundError, largest_remainder, load_hover, load_livebench_math

from tests.test_programs_helpers import require_data


def test_livebench_math_split_reproduces_terrarium_ids_in_order():
    root = require_data("livebench_math/terrarium_split_question_ids.json")
    expected = json.loads((root / "livebench_math" / "terrarium_split_question_ids.json").read_text())
    split = load_livebench_math(root)
    assert (len(split.train), len(split.val), len(split.test)) == (100, 100, 168)
    for name in ("train", "val", "test"):
        assert [e.question_id for e in getattr(split, name)] == expected[name]


def test_livebench_math_examples_carry_what_the_solver_and_scorer_need():
    split = load_livebench_math(require_data("livebench_math"))
    example = split.train[0]
    assert set(example.inputs().keys()) == {"question"}
    assert example.subtask and example.answer and "answer" not in example.inputs()
    assert {e.subtask.split("_")[0] for e in split.val} >= {"amc", "aime", "amps", "usamo", "imo", "smc"}


def test_livebench_split_is_independent_of_row_order():
    rows = data.livebench_math_rows(require_data("livebench_math"))
    key = dict(group_of=lambda r: r["subtask"], id_of=lambda r: r["question_id"], n_val=100, n_train=100)
    forward = data.stratified_split(rows, **key)
    backward = data.stratified_split(list(reversed(rows)), **key)
    assert [[r["question_id"] for r in part] for part in forward] == [[r["question_id"] for r in part] for part in backward]


def test_largest_remainder_sums_exactly_and_favours_largest_fractions():
    alloc = largest_remainder(10, {"a": 1, "b": 1, "c": 1})
    assert sum(alloc.values()) == 10 and sorted(alloc.values()) == [3, 3, 4]
    assert alloc["a"] == 4  # ties go to the first group
    assert largest_remainder(100, {"x": 29, "y": 43}) == {"x": 40, "y": 60}  # 40.28 / 59.72
    with pytest.raises(ValueError, match="positive total"):
        largest_remainder(5, {"x": 0})


def test_hover_split_reproduces_the_proposed_offline_split():
    root = require_data("hover/proposed_split_3hop_dev_200_150_200_uids.json", "hover/hover_dev_release_v1.1.json")
    expected = json.loads((root / "hover" / "proposed_split_3hop_dev_200_150_200_uids.json").read_text())
    split = load_hover(root)
    for name in ("train", "val", "test"):
        assert [e.uid for e in getattr(split, name)] == expected[name]
    # Deduplicated by source question, across all three parts.
    ids = [e.hpqa_id for part in split for e in part]
    assert len(ids) == len(set(ids)) == 550


def test_hover_titles_keep_first_seen_order_and_decode_entities():
    row = {"uid": "u", "claim": "c", "hpqa_id": "h", "num_hops": 3,
           "supporting_facts": [["Hoodlum (film)", 1], ["Davina (R&amp;B singer)", 2], ["Hoodlum (film)", 0]]}
    assert data.hover_example(row).titles == ["Hoodlum (film)", "Davina (R&B singer)"]
    hub_row = dict(row, supporting_facts=[{"key": "B", "value": 0}, {"key": "A", "value": 1}, {"key": "B", "value": 2}])
    assert data.hover_example(hub_row).titles == ["B", "A"]


def test_hover_split_filters_three_hops_and_dedups_by_source_question():
    rows = [{"uid": str(i), "claim": f"c{i}", "hpqa_id": f"q{i // 2}", "num_hops": 3 if i % 3 else 2,
             "supporting_facts": [["T", 0]]} for i in range(60)]
    train, val, test = data.hover_split(rows, n_train=5, n_val=5, n_test=5)
    kept = train + val + test
    assert all(r["num_hops"] == 3 for r in kept)
    assert len({r["hpqa_id"] for r in kept}) == 15
    with pytest.raises(ValueError, match="lower the sizes"):
        data.hover_split(rows, n_train=100, n_val=1, n_test=1)


def test_missing_local_data_names_both_the_directory_and_the_online_option(tmp_path, monkeypatch):
    monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)
    with pytest.raises(DataNotFoundError, match=r"DSPY_PXN_DATA_DIR is not set.*data_dir=PATH.*online=True"):
        load_livebench_math()
    with pytest.raises(DataNotFoundError, match=rf"{tmp_path}.*hover/hover_dev_release_v1.1.json.*online=True"):
        load_hover(tmp_path)
    monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path))
    with pytest.raises(DataNotFoundError, match="livebench_math/"):
        load_livebench_math()


def test_data_dir_env_is_used_when_no_argument(monkeypatch):
    root = require_data("livebench_math")
    monkeypatch.setenv(data.DATA_DIR_ENV, str(root))
    assert len(load_livebench_math().test) == 168


def _fake_datasets(monkeypatch, tables):
    """A stand-in `datasets` module: the online path runs without network and records what it asked for."""
    calls = []

    def load_dataset(name, split, **kwargs):
        calls.append((name, split, kwargs))
        if name not in tables:
            raise ConnectionError("offline")
        return tables[name]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    return calls


def test_online_livebench_uses_the_hub_test_split_and_the_same_recipe(monkeypatch):
    rows = data.livebench_math_rows(require_data("livebench_math"))
    calls = _fake_datasets(monkeypatch, {"livebench/math": list(reversed(rows))})
    online = load_livebench_math(online=True, revision="main")
    offline = load_livebench_math(require_data("livebench_math"))
    assert calls == [("livebench/math", "test", {"revision": "main"})]
    assert [e.question_id for e in online.val] == [e.question_id for e in offline.val]


def test_online_hover_uses_the_hub_train_split(monkeypatch):
    rows = [{"uid": str(i), "claim": f"c{i}", "hpqa_id": f"q{i}", "num_hops": 3, "label": 1,
             "supporting_facts": [{"key": f"T{i}", "value": 0}, {"key": "Shared", "value": 1}]} for i in range(30)]
    calls = _fake_datasets(monkeypatch, {"hover-nlp/hover": rows})
    split = load_hover(online=True, n_train=10, n_val=10, n_test=10)
    assert calls[0][:2] == ("hover-nlp/hover", "train")
    assert sorted(int(e.uid) for part in split for e in part) == list(range(30))
    assert all(e.titles == [f"T{e.uid}", "Shared"] for e in split.train)


def test_online_gsm8k_uses_the_hub_main_config_and_picks_the_same_examples(monkeypatch):
    from dspy_pxn.programs.gsm8k import load_gsm8k

    root = require_data("gsm8k")
    hub = {split: data._read_jsonl(root / "gsm8k" / f"{split}.jsonl") for split in ("train", "test")}
    calls = []

    def load_dataset(path, split, **kwargs):
        calls.append((path, split, kwargs))
        return hub[split]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    online = load_gsm8k(online=True, n_train=5, n_val=3, n_test=4, seed=7)
    offline = load_gsm8k(root, n_train=5, n_val=3, n_test=4, seed=7)
    assert calls == [("openai/gsm8k", "train", {"name": "main"}), ("openai/gsm8k", "test", {"name": "main"})]
    assert [[(e.question, e.answer) for e in part] for part in online] == [
        [(e.question, e.answer) for e in part] for part in offline]


def test_online_failure_is_a_clear_error_naming_the_offline_alternative(monkeypatch):
    _fake_datasets(monkeypatch, {})
    with pytest.raises(DataNotFoundError, match=r"could not load 'livebench/math'.*data_dir=PATH / DSPY_PXN_DATA_DIR"):
        load_livebench_math(online=True)
