"""prepare.py on our 40-row fixture: each filter stage removes a known number of rows, splits are
deterministic and disjoint by problem hash, and the data card says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rftlib.data import prepare as prep
from rftlib.data.jsonl import DataError, read_jsonl

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "fixtures"
MAIN = FIXTURES / "numina_fixture.jsonl"
OOD = FIXTURES / "numina_ood_fixture.jsonl"
# Stage -> rows left, as the fixture was written (its rows are grouped by the stage removing them):
# 40 rows; 4 not word problems; 5 without a clean integer answer (1/2, 3.5, x=4, "", null);
# 3 AMC/AIME; 3 invalid (blank problem, null solution, problem_is_valid "no"); 3 duplicates
# (exact, whitespace variant, same problem with another solution); 2 too short.
EXPECTED = [40, 36, 31, 28, 25, 22, 20]
SIZES = dict(rl_pool_size=8, sft_size=4, sft_dev_size=2, eval_size=3, probe_size=4)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared")
    return out, prep.prepare(MAIN, out, seed=42, ood_path=OOD, **SIZES)


def test_each_stage_removes_the_known_rows(run):
    _, card = run
    assert [s["remaining"] for s in card["stages"]] == EXPECTED
    assert [s["removed"] for s in card["stages"]] == [0, 4, 5, 3, 3, 3, 2]
    assert card["stages"][5]["stage"].startswith("deduplicate")


def test_clean_integer_normalises():
    assert prep.clean_integer("$42$") == "42"
    assert prep.clean_integer("1,000") == "1000"
    assert prep.clean_integer("007") == "7"
    assert prep.clean_integer(-7) == "-7"
    for bad in ("3.5", "\\frac{1}{2}", "x=4", "", None, True):
        assert prep.clean_integer(bad) is None


def test_splits_have_the_asked_sizes_and_the_seed_format(run):
    out, card = run
    rows = {name: card["splits"][name]["rows"] for name in card["splits"]}
    assert rows == {"eval": 3, "sft_dev": 2, "sft_train": 4, "sft_rl_pool": 8, "probe_set_4": 4, "probe_set_4_ood": 4}
    assert card["unassigned_after_filters"] == 20 - 3 - 2 - 4 - 8
    rl = read_jsonl(out / "sft_rl_pool.jsonl")
    assert all(set(r) == {"input", "label"} for r in rl)
    sft = read_jsonl(out / "sft_train.jsonl")
    assert all(set(r) == {"input", "output", "label"} and "\\boxed{" in r["output"] for r in sft)
    assert {r["label"] for r in rl + sft} <= {"42", "180", "120", "-7", "1000", "7", "23", "8", "36", "300", "35",
                                              "1095", "70", "465", "63", "225", "99", "900"}


def test_zero_overlap_proof_from_the_written_files(run):
    out, card = run
    proof = card["overlap"]
    assert proof["zero_overlap"]
    shared = {(p["a"], p["b"]): p["shared"] for p in proof["pairs"]}
    assert shared[("sft_rl_pool", "probe_set_4")] == 4  # the ID probe is drawn from the pool, by design
    assert all(n == 0 for pair, n in shared.items() if pair != ("sft_rl_pool", "probe_set_4"))
    assert proof["subsets"] == {"probe_set_4": True}
    # recomputing from disk gives the same proof
    files = {n: out / s["file"] for n, s in card["splits"].items()}
    assert prep.overlap_proof(files, {"probe_set_4": "sft_rl_pool"}) == proof


def test_ood_probe_is_filtered_and_disjoint_from_the_main_input(run):
    out, card = run
    assert [s["remaining"] for s in card["ood_stages"]] == [8, 7, 7, 7, 7, 7, 7, 6]
    main = {prep.problem_hash(r["problem"]) for r in read_jsonl(MAIN)}
    assert not main & set(prep.file_hashes(out / "probe_set_4_ood.jsonl"))


def test_deterministic_and_independent_of_row_order(tmp_path, run):
    out, card = run
    shuffled = tmp_path / "shuffled.jsonl"
    shuffled.write_text("".join(reversed(MAIN.read_text().splitlines(keepends=True))))
    card2 = prep.prepare(shuffled, tmp_path / "b", seed=42, ood_path=OOD, **SIZES)
    assert [s["remaining"] for s in card2["stages"]] == EXPECTED
    for name in card["splits"]:
        assert card2["overlap"]["files"][name]["digest"] == card["overlap"]["files"][name]["digest"]
    card3 = prep.prepare(MAIN, tmp_path / "c", seed=7, ood_path=OOD, **SIZES)
    assert card3["overlap"]["files"]["sft_rl_pool"]["digest"] != card["overlap"]["files"]["sft_rl_pool"]["digest"]


def test_data_card_files(run):
    out, card = run
    assert json.loads((out / "data_card.json").read_text()) == card
    md = (out / "data_card.md").read_text()
    assert "| deduplicate by problem hash (MD5) | 22 | 3 |" in md
    assert "Zero overlap: **yes**" in md


def test_too_large_split_is_an_error(tmp_path):
    with pytest.raises(DataError, match="sft_train: asked for 30 rows"):
        prep.prepare(MAIN, tmp_path, rl_pool_size=None, sft_size=30, sft_dev_size=0, eval_size=0, probe_size=1)


def test_rl_pool_all_takes_the_rest(tmp_path):
    card = prep.prepare(MAIN, tmp_path, rl_pool_size=None, sft_size=2, sft_dev_size=1, eval_size=1, probe_size=3)
    assert card["splits"]["sft_rl_pool"]["rows"] == 20 - 4
    assert card["unassigned_after_filters"] == 0


def test_missing_column_names_it(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text(json.dumps({"problem": "p", "solution": "s", "answer": "1"}) + "\n")
    with pytest.raises(DataError, match=rf"^{p}:1: missing column 'problem_type'"):
        prep.prepare(p, tmp_path / "o", rl_pool_size=None, sft_size=0)


def test_cli(tmp_path, capsys):
    rc = prep.main([str(MAIN), "--out", str(tmp_path), "--rl-pool-size", "all", "--sft-size", "3",
                    "--sft-dev-size", "1", "--eval-size", "2", "--probe-size", "5", "--seed", "42", "--ood", str(OOD)])
    assert rc == 0
    assert "Zero overlap: **yes**" in capsys.readouterr().out
    assert (tmp_path / "probe_set_5_ood.jsonl").is_file()


def test_gsm8k_adapter_boxes_the_answer():
    sol = "She has 16 - 3 = <<16-3=13>>13 eggs.\nShe earns 13 * 2 = $<<13*2=26>>26.\n#### 1,026"
    out = prep.gsm8k_solution_to_boxed(sol)
    assert "<<" not in out and out.endswith("The answer is $\\boxed{1026}$.")


def test_prepared_task_reads_the_output(run):
    out, _ = run
    task = prep.prepared_task(str(out))
    assert len(task.train) == 8 and len(task.eval) == 3
    assert {k: len(v) for k, v in task.probes.items()} == {"id": 4, "ood": 4}
    assert task.eval[0].prompt.endswith("\\boxed{}.")


def _prepared_dir(tmp_path: Path, pool_rows: list) -> Path:
    d = tmp_path / "prepared"
    d.mkdir()
    (d / "sft_rl_pool.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pool_rows))
    (d / "eval.jsonl").write_text(json.dumps({"input": "What is 2 + 2?", "label": "4"}) + "\n")
    return d


@pytest.mark.parametrize("row, msg", [
    ({"input": 17, "label": "3"}, r"'input' must be non-empty text \(the problem\), got int 17"),  # was a bare TypeError
    ({"input": ["a", "list"], "label": "3"}, r"'input' must be non-empty text"),
    ({"input": "   ", "label": "3"}, r"'input' must be non-empty text"),
    ({"input": "What is 1 + 2?", "label": None}, r"'label' must be the answer .* got NoneType None"),  # was gold "None"
    ({"input": "What is 1 + 2?", "label": True}, r"'label' must be the answer"),
    ({"input": "What is 1 + 2?", "label": ""}, r"'label' must be the answer"),
])
def test_bad_rl_row_is_an_error_at_its_file_and_line(tmp_path, row, msg):
    good = {"input": "What is 1 + 1?", "label": "2"}
    d = _prepared_dir(tmp_path, [good, row])  # the bad row is line 2
    with pytest.raises(DataError, match=rf"sft_rl_pool.jsonl:2: {msg}"):
        prep.prepared_task(str(d))


def test_integer_label_is_the_gold_text(tmp_path):
    d = _prepared_dir(tmp_path, [{"input": "What is 1 + 1?", "label": 2}])
    assert prep.prepared_task(str(d)).train[0].answer == "2"
