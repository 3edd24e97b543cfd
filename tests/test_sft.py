"""The SFT stage (TRL SFTTrainer + LoRA) on the tiny model: it trains, writes an attempt like an RL
one with before/after evals, and an RL attempt starts from its adapter and links back to it."""

from __future__ import annotations

import json

import pytest
import torch

from rftlib.cli import main
from rftlib.config import ConfigError, make_config
from rftlib.monitor.metrics import read_metrics
from rftlib.report import analysis
from rftlib.report.attempt import load_attempt
from rftlib.report.index import build_index

pytest.importorskip("trl")
from rftlib import sft  # noqa: E402  (needs trl)


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """One SFT attempt on the tiny model (sft-tiny: 4 steps of 8 rows, 16 held-out problems)."""
    cfg = make_config("sft-tiny", {"runs_root": str(tmp_path_factory.mktemp("sft") / "runs")})
    summary = sft.run_sft(cfg, write=lambda s: None)
    return cfg, summary


def test_sft_trains_on_the_completion_and_records_before_after(sft_run):
    cfg, summary = sft_run
    run_dir = load_attempt(summary["run_dir"]).run_dir
    rows = read_metrics(run_dir)
    train = [r for r in rows if "sft/loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4]  # logging_steps 1, max_steps 4
    assert train[-1]["sft/loss"] < train[0]["sft/loss"]  # lr 1e-3 on 8 rows a step: the loss falls
    # the adapter moved away from peft's init (lora_B starts at zero)
    from safetensors.torch import load_file

    ad = load_file(str(run_dir / "adapter" / "adapter_model.safetensors"))
    assert any(k.endswith("lora_B.weight") and v.abs().max() > 0 for k, v in ad.items())
    # before/after recomputed from the eval files: mean of the per-problem has_boxed / correct
    for step, key in ((0, "format_before"), (cfg.num_steps, "format_after")):
        res = json.loads((run_dir / "eval" / f"step_{step}.json").read_text())["results"]
        assert len(res) == 16 and summary[key] == sum(r["has_boxed"] for r in res) / 16
    res0 = json.loads((run_dir / "eval" / "step_0.json").read_text())["results"]
    assert summary["baseline"] == sum(r["correct"] for r in res0) / 16
    assert [r["step"] for r in rows if sft.FORMAT_KEY in r] == [0, cfg.num_steps]
    assert "--set init_adapter=" in summary["next"] and summary["output"].endswith("adapter")


def test_sft_loss_is_on_the_completion_only(sft_run, tmp_path):
    """completion_only_loss: the labels keep exactly the assistant turn's tokens (the prompt is -100)."""
    from rftlib.models.loading import load_model_and_tokenizer

    cfg, _ = sft_run
    _, SFTTrainer, _ = sft._trl()
    model, tok = load_model_and_tokenizer("tiny")
    row = {"input": "Calculate 1 + 2. Put the final answer in \\boxed{}.", "output": "The answer is \\boxed{3}."}
    tr = SFTTrainer(model=model, args=sft.sft_config(cfg, tmp_path, False), train_dataset=sft.to_dataset([row], None),
                    processing_class=tok)
    labels = tr.data_collator([tr.train_dataset[0]])["labels"][0]
    kept = tok.decode(labels[labels != -100])
    assert kept.startswith("The answer is \\boxed{3}.") and "Calculate" not in kept and "user" not in kept


def test_a_later_turns_row_trains_only_its_answer_after_the_context(sft_run, tmp_path):
    """A row with ``context`` (the call and the tool's result before the trained answer: the warm start's second
    row per problem): the context is prompt, rendered as the chat template renders those turns, and the labels
    keep exactly the answer; a context that is not a list of role/content messages is refused naming the line."""
    from rftlib.models.loading import load_model_and_tokenizer

    cfg, _ = sft_run
    _, SFTTrainer, _ = sft._trl()
    model, tok = load_model_and_tokenizer("tiny")
    row = {"input": "Calculate 12 * 345.", "output": "The product is \\boxed{4140}.",
           "context": [{"role": "assistant", "content": "<tool_call>12 * 345</tool_call>"},
                       {"role": "tool", "content": "4140"}]}
    tr = SFTTrainer(model=model, args=sft.sft_config(cfg, tmp_path, False), train_dataset=sft.to_dataset([row], None),
                    processing_class=tok)
    batch = tr.data_collator([tr.train_dataset[0]])
    labels, ids = batch["labels"][0], batch["input_ids"][0]
    kept = tok.decode(labels[labels != -100])
    assert kept.startswith("The product is \\boxed{4140}.") and "tool_call" not in kept and "4140}" in kept
    assert "<|im_start|>tool\n4140<|im_end|>" in tok.decode(ids)  # the context is in the sequence, as prompt
    n = sft.row_lengths(tok, [row], None)[0]
    assert n["prompt"] == len(sft._ids(tok.apply_chat_template(sft.row_messages(row, None), tokenize=True,
                                                               add_generation_prompt=True)))
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"input": "Calculate 1 * 2.", "output": "2"}) + "\n"
                    + json.dumps({"input": "Calculate 1 * 3.", "output": "3", "context": "4140"}) + "\n")
    from rftlib.data.multiply import multiply_task

    with pytest.raises(ConfigError, match=r"bad.jsonl line 2: 'context' must be a list of messages"):
        sft.load_sft_rows(path, multiply_task())


def test_sft_refuses_a_split_that_holds_held_out_prompts(tmp_path):
    from rftlib.data.base import build_task

    boxed = "Put the final answer in \\boxed{}."
    task = build_task("arithmetic", eval_size=16, instruction=boxed)
    bad = tmp_path / "leak.jsonl"
    bad.write_text(json.dumps({"input": task.eval[0].prompt, "output": "x"}) + "\n")
    with pytest.raises(ConfigError, match="held-out"):
        sft.load_sft_rows(bad, task)
    # the same held-out problem without the instruction (a bare problem, as seed 003's SFT rows are): still it
    bare = tmp_path / "bare.jsonl"
    bare.write_text(json.dumps({"input": task.eval[0].prompt.replace(" " + boxed, ""), "output": "x"}) + "\n")
    with pytest.raises(ConfigError, match="1 of 1 rows hold problems"):
        sft.load_sft_rows(bare, task)
    # the task gives no instruction, the SFT rows carry one: the format taught is not the one RL shows
    plain = build_task("arithmetic", eval_size=100)
    with pytest.raises(ConfigError, match="match the task's prompt"):
        sft.load_sft_rows(sft.project_root() / "data/sft/arithmetic_boxed.jsonl", plain)
    with pytest.raises(ConfigError, match="sft_data is not set"):
        sft.sft_data_path(make_config("tiny"))


def test_sft_takes_seed003_prepared_data_and_compares_problems_not_prompt_text(tmp_path):
    """The prepared task appends an instruction to every problem, prepare's sft_train.jsonl holds
    bare problems; the split is accepted, shown to the model as the task shows its prompts, and held-out problems
    are found by the prepare pipeline's identity (its hash), whatever the wording around them."""
    from rftlib.data import prepare as prep
    from rftlib.data.base import build_task
    from rftlib.data.benchmarks import MATH_INSTRUCTION
    from rftlib.data.jsonl import read_jsonl

    out = tmp_path / "prepared"
    fixtures = sft.project_root() / "data" / "fixtures"
    prep.prepare(fixtures / "numina_fixture.jsonl", out, rl_pool_size=8, sft_size=4, sft_dev_size=2, eval_size=3,
                 probe_size=4, seed=42, ood_path=fixtures / "numina_ood_fixture.jsonl")
    task = build_task("prepared", data_dir=str(out))
    raw = read_jsonl(out / "sft_train.jsonl")
    rows = sft.load_sft_rows(out / "sft_train.jsonl", task)  # main: "no prompt is a training prompt"
    assert [r["prompt"] for r in rows] == [r["input"] + "\n" + MATH_INSTRUCTION for r in raw]
    assert [r["output"] for r in rows] == [r["output"] for r in raw]
    # every held-out problem (bare, as an SFT row) plus one training prompt: refused (main accepted it)
    held = read_jsonl(out / "eval.jsonl")
    assert len(held) == 3
    leak = tmp_path / "leak.jsonl"
    leak.write_text("".join(json.dumps({"input": r["input"], "output": "x"}) + "\n" for r in held)
                    + json.dumps({"input": task.train[0].prompt, "output": "y"}) + "\n")
    with pytest.raises(ConfigError, match=r"3 of 4 rows hold problems of task 'prepared''s eval sets \(3 in 'heldout'"):
        sft.load_sft_rows(leak, task)
    # one held-out problem worded another way: an instruction before it, its whitespace changed, another after it
    other = tmp_path / "other.jsonl"
    text = "Solve the following problem.\n" + "  ".join(held[1]["input"].split()) + "\nBox the answer."
    other.write_text(json.dumps({"input": text, "output": "x"}) + "\n")
    with pytest.raises(ConfigError, match="1 of 1 rows hold problems.*eval/1"):
        sft.load_sft_rows(other, task)
    # the out-of-distribution probe is guarded too (it is not drawn from the pool); the in-distribution one is
    ood = read_jsonl(out / "probe_set_4_ood.jsonl")
    probe = tmp_path / "probe.jsonl"
    probe.write_text(json.dumps({"input": ood[0]["input"], "output": "x"}) + "\n")
    with pytest.raises(ConfigError, match="1 in 'ood'"):
        sft.load_sft_rows(probe, task)
    idp = tmp_path / "id.jsonl"
    idp.write_text(json.dumps({"input": read_jsonl(out / "probe_set_4.jsonl")[0]["input"], "output": "x"}) + "\n")
    assert len(sft.load_sft_rows(idp, task)) == 1


def test_sft_trains_every_row_whole_within_the_attempts_budget(tmp_path, monkeypatch):
    """A row longer than TRL's default max_length (1024) that fits the attempt's budget is trained
    whole, not cut from its end; a row whose answer is longer than max_new_tokens (the RL stage would cut it) is left
    out and reported, never trained cut."""
    from rftlib.data.base import build_task
    from rftlib.models.loading import load_model_and_tokenizer

    over = {"runs_root": str(tmp_path / "runs"), "max_new_tokens": 24, "num_steps": 1, "micro_batch_size": 4}
    cfg = make_config("sft-tiny", over)
    task = build_task(cfg.task, eval_size=cfg.eval_size, **cfg.task_args)
    ok = {"input": task.train[0].prompt, "output": f"\\boxed{{{task.train[0].answer}}}"}
    long_prompt = {"input": "Count the words: " + "lorem " * 1100 + cfg.task_args["instruction"], "output": "\\boxed{1100}"}
    long_answer = {"input": task.train[1].prompt, "output": "ipsum " * 60 + f"\\boxed{{{task.train[1].answer}}}"}
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in (ok, long_prompt, long_answer, ok, ok)))
    cfg = make_config("sft-tiny", {**over, "sft_data": str(data)})

    _, tok = load_model_and_tokenizer("tiny")

    def count(r):  # the whole sequence and the answer's tokens up to the end of turn, counted here independently
        msgs = [{"role": "user", "content": r["input"]}]  # every input here ends with the task's instruction
        p = list(tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)["input_ids"])
        f = list(tok.apply_chat_template(msgs + [{"role": "assistant", "content": r["output"]}],
                                         tokenize=True)["input_ids"])
        assert f[:len(p)] == p
        return len(f), f[len(p):].index(tok.eos_token_id) + 1

    assert count(long_prompt)[0] > 1024 and count(long_prompt)[1] <= 24 < count(long_answer)[1]
    seen = []
    SFTConfig, SFTTrainer, Dataset = sft._trl()

    class Spy(SFTTrainer):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            seen.append(self)

    monkeypatch.setattr(sft, "_trl", lambda: (SFTConfig, Spy, Dataset))
    out = []
    summary = sft.run_sft(cfg, write=out.append)
    ds = seen[0].train_dataset
    lengths = sorted(len(x) for x in ds["input_ids"])
    assert lengths == sorted([count(ok)[0]] * 3 + [count(long_prompt)[0]])  # main: 1024 for the long row, 5 rows
    long_row = next(x for x in ds if len(x["input_ids"]) == count(long_prompt)[0])
    assert tok.decode([t for t in long_row["labels"] if t != -100]).startswith("\\boxed{1100}")  # its answer is there
    assert summary["sft_rows"] == 4 and summary["sft_rows_too_long"] == 1
    assert summary["sft_max_length"] == count(long_prompt)[0]
    dropped = json.loads((tmp_path / "runs" / summary["attempt_id"] / "logs" / "sft_dropped.json").read_text())
    assert [d["line"] for d in dropped["rows"]] == [3] and dropped["rows"][0]["generated"] == count(long_answer)[1]
    assert any("1 of 5 SFT rows are longer than the attempt's budget" in line for line in out)


def test_sft_refuses_a_split_mostly_longer_than_the_budget(tmp_path):
    """More than half the rows too long: the budget does not fit the data (refused, naming the fix)."""
    cfg = make_config("sft-tiny", {"max_new_tokens": 24})
    rows = [{"input": f"q{i}", "output": "a"} for i in range(4)]
    lengths = [{"prompt": 10, "completion": c + 2, "generated": c + 1, "total": 12 + c} for c in (5, 30, 40, 50)]
    with pytest.raises(ConfigError, match=r"3 of 4 rows do not fit.*max_new_tokens=24.*longest completion is 51"):
        sft.fit_rows(rows, lengths, cfg, "x.jsonl")
    kept, kept_len, dropped, max_len = sft.fit_rows(rows, lengths[:3] + [lengths[0]], cfg, "x.jsonl")
    assert [d["line"] for d in dropped] == [2, 3] and max_len == 17 and len(kept) == len(kept_len) == 2
    capped = make_config("sft-tiny", {"max_new_tokens": 100, "prompt_max_len": 9})
    with pytest.raises(ConfigError, match="prompt <= prompt_max_len=9"):
        sft.fit_rows(rows, lengths, capped, "x.jsonl")


def test_rl_starts_from_the_sft_adapter_and_its_report_links_the_parent(sft_run, tiny_cfg, tmp_path):
    from safetensors.torch import load_file

    from rftlib.train.loop import Trainer

    _, summary = sft_run
    adapter = summary["output"]
    cfg = tiny_cfg(init_adapter=adapter, task="arithmetic", task_args={"instruction": "Put the final answer in \\boxed{}."},
                   num_steps=1, save_steps=0)
    tr = Trainer(cfg, progress=False)
    try:
        saved = load_file(f"{adapter}/adapter_model.safetensors")
        live = {k: v for k, v in tr.model.state_dict().items() if "lora_" in k}
        b = next(k for k in saved if k.endswith("lora_B.weight"))
        match = next(v for k, v in live.items() if k.replace(".default", "") == b)
        assert torch.equal(match, saved[b]) and saved[b].abs().max() > 0  # started from the SFT weights
        tr.train()
    finally:
        tr.close()
    a = load_attempt(tr.run_dir)
    assert a.parent == load_attempt(summary["run_dir"]).run_dir
    header = str(analysis.header(a))
    sft_id = summary["attempt_id"]
    assert f'<a href="{sft_id}.html">{sft_id}</a>' in header and "format compliance" in header
    index = str(build_index(tr.run_dir.parent, tmp_path / "reports"))
    assert f"from <a href=\"{sft_id}.html\">" in index


def test_rl_from_an_sft_adapter_refuses_a_held_out_set_the_sft_trained_on(sft_run, tiny_cfg, tmp_path):
    """The SFT split is the 100 training problems of the arithmetic task at eval_size 100; an RL
    attempt from its adapter at eval_size 150 holds 50 of them in its held-out set (main trained on it and reported
    held-out accuracy on memorised problems). Refused, from the SFT attempt's record of its rows, from an older SFT
    attempt's config (no record), and through an RL checkpoint's adapter whose attempt started from the SFT one."""
    import shutil

    import yaml

    from rftlib.data.arithmetic import all_problems
    from rftlib.data.base import build_task
    from rftlib.train.loop import Trainer

    _, summary = sft_run
    sft_dir = load_attempt(summary["run_dir"]).run_dir
    boxed = {"instruction": "Put the final answer in \\boxed{}."}
    held = build_task("arithmetic", eval_size=150, **boxed).eval
    rows = [json.loads(x)["input"] for x in (sft.project_root() / "data/sft/arithmetic_boxed.jsonl").read_text().splitlines()]
    by_text = {f"Calculate {e.meta['a']} {e.meta['op']} {e.meta['b']}": e.id for e in all_problems()}
    overlap = {e.id for e in held} & {by_text[r.split(".")[0]] for r in rows}
    assert len(rows) == 100 and len(overlap) == 50
    cfg = tiny_cfg(init_adapter=summary["output"], task="arithmetic", task_args=boxed, eval_size=150, num_steps=1)
    with pytest.raises(ConfigError, match=rf"SFT attempt {sft_dir.name} trained on 50 problems .*50 of its 150 held-out"):
        Trainer(cfg, progress=False)
    from rftlib.attempts import SFT_ROWS

    trained = [json.loads(x)["input"] for x in (sft_dir / SFT_ROWS).read_text().splitlines()]
    assert trained == rows  # the SFT attempt's record: one line per row it trained on
    # eval_size 100: the held-out set the SFT split was cut against; no overlap, it builds
    Trainer(tiny_cfg(init_adapter=summary["output"], task="arithmetic", task_args=boxed, eval_size=100,
                     num_steps=1), progress=False).close()

    # an SFT attempt from before the record: its config's sft_data, as the file is now
    old = tmp_path / "old-sft"
    shutil.copytree(sft_dir, old, ignore=shutil.ignore_patterns(SFT_ROWS))  # as an SFT attempt of main
    with pytest.raises(ConfigError, match=r"trained on 50 problems .*as it is now"):
        Trainer(tiny_cfg(init_adapter=str(old / "adapter"), task="arithmetic", task_args=boxed, eval_size=150),
                progress=False)

    # RL attempt -> its checkpoint's adapter -> a third attempt: the SFT grandparent is still checked
    rl = tmp_path / "rl-attempt"
    (rl / "training_state" / "step_1").mkdir(parents=True)
    shutil.copytree(sft_dir / "adapter", rl / "training_state" / "step_1" / "adapter")
    doc = yaml.safe_load((sft_dir / "config.yaml").read_text())
    doc["config"].update(init_adapter=summary["output"], sft_data=None, task_args=boxed, eval_size=100)
    (rl / "config.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=rf"SFT attempt {sft_dir.name} trained on 50"):
        Trainer(tiny_cfg(init_adapter=str(rl / "training_state" / "step_1" / "adapter"), task="arithmetic",
                         task_args=boxed, eval_size=150), progress=False)


def test_format_check_says_which_command_to_run(tmp_path):
    from rftlib.attempts import create_attempt

    def attempt(name, task_args, boxed):
        cfg = make_config("tiny", {"runs_root": str(tmp_path / "runs"), "name": name, "task_args": task_args})
        d = create_attempt(cfg)
        (d / "eval").mkdir()
        res = [{"has_boxed": float(i < boxed)} for i in range(20)]
        (d / "eval" / "step_0.json").write_text(json.dumps({"results": res}))
        return d

    boxed = {"instruction": "Put the final answer in \\boxed{}."}
    low = sft.format_check(attempt("low", boxed, 18))  # 18/20 = 90% < 95%
    assert "rate 90% on 20" in low and "SFT needed" in low and "rft sft -p sft-arithmetic-boxed" in low
    assert "sft_data=data/sft/arithmetic_boxed.jsonl" in low and "init_adapter=" in low
    assert "--set max_new_tokens=12" in low  # the RL attempt's budget (tiny: 12 tokens), which SFT's rows must fit
    assert "SFT not needed" in sft.format_check(attempt("high", boxed, 19))  # 19/20 = 95%
    assert "not applicable" in sft.format_check(attempt("plain", {}, 0))  # no \boxed{} asked for


def test_rft_sft_runs_the_notebook_and_writes_the_report(tmp_path, capsys, monkeypatch):
    """Also with what a one-rank DeepSpeed group set up earlier in the same process leaves behind (rftlib's
    init_dist sets RANK/WORLD_SIZE/MASTER_PORT for it) and that port still held: accelerate, under TRL, then
    tried to join a process group there (the full suite hit DistNetworkError EADDRINUSE in the kernel)."""
    import socket

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    for k, v in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(busy.getsockname()[1]), RANK="0", WORLD_SIZE="1",
                     LOCAL_RANK="0").items():
        monkeypatch.setenv(k, v)
    runs = tmp_path / "runs"
    assert main(["sft", "-p", "sft-tiny", "--set", f"runs_root={runs}", "--set", "num_steps=2"]) == 0
    busy.close()
    out = capsys.readouterr().out
    (run_dir,) = runs.glob("attempt-*")
    assert "format compliance" in out and "next: rft train" in out
    assert (run_dir / "notebook.ipynb").exists() and (run_dir / "adapter" / "adapter_config.json").exists()
    html = (tmp_path / "reports" / f"{run_dir.name}.html").read_text()
    assert run_dir.name in html and "format compliance" in html
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 2


def test_a_tool_warm_starts_evals_play_the_environment(tmp_path):
    """An SFT attempt that names an environment (sft-calc-cpu's warm start for calc-cpu) evaluates before and after
    by playing each held-out problem in it, greedily, as the RL attempt's evals do: the eval files say which
    environment and carry each episode's tool calls, and the tool-call rate in the summary and the metrics row is
    the share of episodes with a call, recounted here from the per-problem results."""
    cfg = make_config("sft-tiny", {"runs_root": str(tmp_path / "runs"), "num_steps": 1, "task": "multiply",
                                   "task_args": {"tool_prompt": True}, "env": "calculator", "max_turns": 2,
                                   "max_trajectory_tokens": 24,
                                   "sft_data": "data/sft/calc_tool_calls.jsonl", "max_new_tokens": 96})
    summary = sft.run_sft(cfg, write=lambda s: None)
    run_dir = load_attempt(summary["run_dir"]).run_dir
    rows = {r["step"]: r for r in read_metrics(run_dir) if sft.FORMAT_KEY in r}
    for step, when in ((0, "before"), (1, "after")):
        res = json.loads((run_dir / "eval" / f"step_{step}.json").read_text())
        assert res["env"] == "calculator" and res["max_turns"] == 2
        got = [r for r in res["results"]]
        assert len(got) == 16 and all("tool_calls" in r and 1 <= r["turns"] <= 2 for r in got)
        rate = sum(r["tool_calls"] > 0 for r in got) / 16
        assert summary[f"tool_call_rate_{when}"] == rate == rows[step]["eval/heldout/tool_call_rate"]
    assert "tool calls in" in sft.sft_result_text(summary)
