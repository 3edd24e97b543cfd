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


def test_sft_refuses_a_split_that_holds_held_out_prompts(tmp_path):
    from rftlib.data.base import build_task

    task = build_task("arithmetic", eval_size=16, instruction="Put the final answer in \\boxed{}.")
    bad = tmp_path / "leak.jsonl"
    bad.write_text(json.dumps({"input": task.eval[0].prompt, "output": "x"}) + "\n")
    with pytest.raises(ConfigError, match="held-out set"):
        sft.load_sft_rows(bad, task)
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"input": "Calculate 1 + 2.", "output": "3"}) + "\n")
    with pytest.raises(ConfigError, match="no prompt is a training prompt"):
        sft.load_sft_rows(other, task)
    with pytest.raises(ConfigError, match="sft_data is not set"):
        sft.sft_data_path(make_config("tiny"))


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
