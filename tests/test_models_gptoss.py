"""gpt-oss from MXFP4: dequantised on load, trainable with LoRA, and under ZeRO-3 loaded
partitioned so that no rank ever holds the whole model.

The checkpoint is rftlib.models.gptoss's: gpt-oss-shaped, experts stored as HF's gpt-oss checkpoints store
them (``*_blocks`` FP4 codes + ``*_scales`` E8M0), random and seeded. Expected weights are computed here
from the E2M1 table written out below, not with transformers' routine. Every FP4 value times a power of
two is exact in bf16 and fp32 (E2M1 has one mantissa bit), so the comparisons are exact.

Run as a script (under torchrun), this file is also the 2-rank worker of the ZeRO-3 memory test.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]  # OCP MX spec
# the ZeRO-3 memory model: big enough that a whole model (~630 MB in fp32) and a half (~315 MB) are far apart,
# made of many small parameters (the largest, one layer's fused gate_up experts, is 16.8 MB)
BIG = dict(layers=24, hidden=256, intermediate=256, experts=32, heads=4, kv_heads=2, head_dim=64)


def expected_expert(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """(E, rows, G, 16) codes + (E, rows, G) exponents -> the (E, cols, rows) parameter, cols = 32 G.

    Byte j of a block holds value 2j in its low nibble and 2j+1 in its high nibble; every value of a
    block of 32 is multiplied by 2**(scale - 127); the parameter is the transpose of the stored rows."""
    table = np.array(E2M1, dtype=np.float64)
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1)  # (E, rows, G, 16, 2)
    vals = table[codes].reshape(*blocks.shape[:-1], 32)  # (E, rows, G, 32)
    vals = vals * np.exp2(scales.astype(np.float64) - 127)[..., None]
    return vals.reshape(*blocks.shape[:2], -1).transpose(0, 2, 1)  # (E, cols, rows)


def _stored(d: Path) -> dict[str, np.ndarray]:
    """The checkpoint's uint8 tensors (codes and scales) as numpy arrays; other tensors' names map to None."""
    from safetensors.torch import load_file

    return {k: v.numpy() if v.dtype == torch.uint8 else None for k, v in load_file(str(d / "model.safetensors")).items()}


@pytest.fixture(scope="module")
def gptoss_dir():
    from rftlib.models.gptoss import gptoss_mxfp4_dir

    return gptoss_mxfp4_dir()


def test_checkpoint_is_stored_as_hf_gptoss_stores_it(gptoss_dir):
    cfg = json.loads((gptoss_dir / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "mxfp4" and cfg["model_type"] == "gpt_oss"
    st = _stored(gptoss_dir)
    e, h, i = cfg["num_local_experts"], cfg["hidden_size"], cfg["intermediate_size"]
    assert st["model.layers.0.mlp.experts.gate_up_proj_blocks"].shape == (e, 2 * i, h // 32, 16)
    assert st["model.layers.0.mlp.experts.gate_up_proj_scales"].shape == (e, 2 * i, h // 32)
    assert st["model.layers.0.mlp.experts.down_proj_blocks"].shape == (e, h, i // 32, 16)
    assert st["model.layers.0.mlp.experts.down_proj_blocks"].dtype == np.uint8
    assert "model.layers.0.mlp.experts.gate_up_proj" not in st  # only the packed form is on disk


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_loader_dequantises_experts_to_the_fp4_table_values(gptoss_dir, dtype):
    from rftlib.models.loading import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(str(gptoss_dir), dtype)
    st = _stored(gptoss_dir)
    for layer in (0, 1):
        experts = model.model.layers[layer].mlp.experts
        for proj in ("gate_up_proj", "down_proj"):
            key = f"model.layers.{layer}.mlp.experts.{proj}"
            want = torch.from_numpy(expected_expert(st[f"{key}_blocks"], st[f"{key}_scales"]))
            got = getattr(experts, proj)
            assert got.dtype == getattr(torch, dtype) and got.shape == want.shape
            assert torch.equal(got.double(), want), key
    assert not getattr(model, "is_quantized", False) and getattr(model, "hf_quantizer", None) is None
    assert model.config._attn_implementation == "eager"  # what the memory preflight counts for gpt-oss


def test_loader_passes_dequantize_to_transformers(gptoss_dir, monkeypatch):
    """On a CPU transformers dequantises MXFP4 by itself (no kernels); on an H100 with triton and `kernels`
    it keeps the packed weights and refuses training unless the loader asks: the argument is what matters."""
    from transformers import Mxfp4Config, PreTrainedModel

    from rftlib.models.loading import load_model_and_tokenizer

    seen = []
    original = PreTrainedModel.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        seen.append(kwargs.get("quantization_config"))
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(spy))
    load_model_and_tokenizer(str(gptoss_dir), "float32")
    assert seen and isinstance(seen[-1], Mxfp4Config) and seen[-1].dequantize is True, seen


def test_lora_grpo_step_on_the_mxfp4_model_trains(gptoss_dir, tmp_path, task_with):
    """One GRPO step through the trainer (load_policy) on the dequantised model: advantages non-zero, the LoRA
    adapter moves, the frozen experts do not."""
    from rftlib.config import make_config
    from rftlib.monitor.metrics import read_metrics
    from rftlib.train.loop import Trainer
    from toy_rewards import letter_a_share  # varies within a group on a random model

    cfg = make_config("tiny", dict(model=str(gptoss_dir), runs_root=str(tmp_path), num_steps=1, rollout_batch_size=2,
                                   n_samples_per_prompt=4, micro_batch_size=4, max_new_tokens=8, eval_steps=0,
                                   eval_size=2, save_steps=0, lr=1e-2, warmup_ratio=0.0, lora_dropout=0.0,
                                   lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], beta=0.0))
    tr = Trainer(cfg, progress=False, task=task_with(cfg, letter_a_share))
    before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    tr.train()
    row = [r for r in read_metrics(tr.run_dir) if "loss" in r][-1]
    assert row["advantage_std"] > 0
    after = dict(tr.model.named_parameters())
    moved = [n for n in before if "lora_B" in n and not torch.equal(before[n], after[n])]
    assert moved, "the LoRA adapter did not move"
    experts = [n for n in before if "experts.gate_up_proj" in n]
    assert experts and all(torch.equal(before[n], after[n]) for n in experts)
    tr.close()


# ---- ZeRO-3: the partitioned load on 2 CPU ranks ---------------------------------------------------------

def _rss_bytes(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def worker(out: str, model: str, mode: str) -> None:
    """One rank: load ``model`` partitioned (load_policy under ZeRO-3) or whole (load_model_and_tokenizer,
    what every rank did before), and record the load's peak resident memory above the pre-load level."""
    import deepspeed  # noqa: F401  (libraries loaded before the baseline)
    import transformers  # noqa: F401

    from rftlib.config import make_config
    from rftlib.models.gptoss import gptoss_mxfp4_dir
    from rftlib.models.loading import load_model_and_tokenizer, load_policy
    from rftlib.settings import ModelSettings, ScaleSettings
    from rftlib.backends import BackendInputs
    from rftlib.backends.deepspeed import deepspeed_config_for
    from rftlib.train.dist import init_dist

    cfg = make_config("tiny", dict(model=model, backend="deepspeed", zero_stage=3, lora_rank=0, dtype="float32",
                                   rollout_batch_size=2, n_samples_per_prompt=2, micro_batch_size=1,
                                   gradient_checkpointing=False))
    dist = init_dist(cfg)

    def load(c):
        if mode == "partitioned":
            backend = BackendInputs.of(c.section, train_prompts=c.train_prompts)
            return load_policy(c.section(ModelSettings), c.section(ScaleSettings), dist,
                               deepspeed_config_for(backend, dist.world_size))[0]
        return load_model_and_tokenizer(c.model, "float32")[0]

    # warm up on the small checkpoint: the modules transformers and DeepSpeed import on a first load (~170 MB
    # of code and state here) are then part of the baseline, so the peak counts what the load itself holds
    del_me = load(dataclasses.replace(cfg, model=str(gptoss_mxfp4_dir())))
    del del_me
    gc.collect()
    dist.barrier()
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
    base = _rss_bytes("VmRSS")
    m = load(cfg)
    peak = _rss_bytes("VmHWM") - base
    full = sum(getattr(p, "ds_numel", p.numel()) for p in m.parameters())
    local = sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel() for p in m.parameters())
    res = {"rank": dist.rank, "peak_bytes": peak, "full_numel": full, "local_numel": local,
           "largest_numel": max(getattr(p, "ds_numel", p.numel()) for p in m.parameters())}
    name = "model.layers.3.mlp.experts.gate_up_proj"
    p = dict(m.named_parameters())[name]
    if mode == "partitioned":
        import deepspeed as ds

        with ds.zero.GatheredParameters([p]):
            value = p.detach().clone()
    else:
        value = p.detach().clone()
    if dist.rank == 0:
        torch.save(value, Path(out) / "value.pt")
    (Path(out) / f"rank{dist.rank}.json").write_text(json.dumps(res))
    dist.barrier()


def _run(out: Path, model: Path, mode: str) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "DS_ACCELERATOR": "cpu",
           # glibc returns freed blocks above this size to the OS at once: the peak measures what was held,
           # not what the allocator kept cached (its default threshold grows up to 32 MB)
           "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__,
           str(out), str(model), mode]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-6000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.fixture(scope="module")
def big_dir():
    from rftlib.models.gptoss import gptoss_mxfp4_dir

    return gptoss_mxfp4_dir(**BIG)


def test_zero3_load_is_partitioned_and_no_rank_holds_the_whole_model(big_dir, tmp_path):
    """Each rank's peak during the load, above its pre-load RSS, against the whole model (fp32, dequantised).

    What a partitioned load holds, term by term: its half of the weights (0.5 of the model); one parameter
    gathered whole on every rank (DeepSpeed's all-gather buffer); on rank 0 the checkpoint read and
    transformers' dequantisation of that parameter (uint8 codes, int32 indices of each nibble, looked-up
    values, the output and its transposed copy: ~3.1x the parameter's fp32 bytes). With the largest parameter
    2.7% of the model that is 0.5 + 5 x 0.027 = 0.63 of the model, before allocator slack. A whole load (the
    old path, on every rank) holds at least 1.0 (the weights) and here measures ~1.2. The bound, 0.8, sits
    between the two (measured here: 0.65 on rank 0, 0.60 on rank 1): a rank holding the whole model fails it."""
    st = _stored(big_dir)
    key = "model.layers.3.mlp.experts.gate_up_proj"
    want = torch.from_numpy(expected_expert(st[f"{key}_blocks"], st[f"{key}_scales"])).float()
    part = _run(tmp_path / "partitioned", big_dir, "partitioned")
    assert torch.equal(torch.load(tmp_path / "partitioned" / "value.pt"), want)  # scattered and gathered back intact
    model_bytes = part[0]["full_numel"] * 4
    assert model_bytes > 500e6 and part[0]["largest_numel"] * 4 / model_bytes < 0.03
    for r in part:
        assert abs(r["local_numel"] / r["full_numel"] - 0.5) < 0.01, r  # half of every parameter on each rank
        assert r["peak_bytes"] < 0.8 * model_bytes, (r, model_bytes)
    whole = _run(tmp_path / "whole", big_dir, "whole")
    for r in whole:  # the measurement can see a whole model: today's path on every rank
        assert r["peak_bytes"] > model_bytes, (r, model_bytes)

    # the preflight's load estimate (rftlib.models.memory.estimate_load_memory) against these peaks. On a CPU the
    # "GPU" rows are host RAM too: a rank holds its GPU rows, and rank 0 also the dequantisation. The estimate
    # counts the tensors the load must hold at once; the measurement adds what it leaves out (the loader's
    # temporaries of one parameter in the checkpoint's dtype, allocator rounding), each a few percent of the
    # model here, so: estimate <= measured <= 1.3 x estimate (measured 1.07-1.15)
    from transformers import AutoConfig

    from rftlib.models.memory import GB, estimate_load_memory, shape_from_hf_config

    shape = shape_from_hf_config(AutoConfig.from_pretrained(big_dir), "big")
    assert shape.n_params == part[0]["full_numel"] and shape.checkpoint == "mxfp4"  # the formula counts every tensor
    g_part, h_part = estimate_load_memory(shape, train_dtype="fp32", world_size=2, zero_stage=3, overhead_gb=0)
    g_whole, h_whole = estimate_load_memory(shape, train_dtype="fp32", world_size=2, zero_stage=3, partitioned=False,
                                            overhead_gb=0, host_baseline_gb=0)
    deq = h_part.gb("MXFP4 dequantisation (rank 0)")
    est = {"partitioned": [g_part.total_gb + deq, g_part.total_gb], "whole": [h_whole.total_gb / 2] * 2}
    # the whole load's floor: transformers 5.19 dequantises MXFP4 to bf16 whatever the dtype, and the loader
    # casts to float32 afterwards (rftlib.models.loading), so the dequantisation's temporaries are gone before
    # the float32 model exists: its peak is the float32 model, the estimate less its dequantisation row
    floor = {"partitioned": est["partitioned"],
             "whole": [(h_whole.total_gb - h_whole.gb("MXFP4 dequantisation (every rank)")) / 2] * 2}
    for mode, rows in (("partitioned", part), ("whole", whole)):
        for r, e, f in zip(sorted(rows, key=lambda r: r["rank"]), est[mode], floor[mode]):
            peak = r["peak_bytes"] / GB
            assert f <= peak and peak / e <= 1.3, (mode, r["rank"], peak, f, e)
    print("peak RSS above pre-load, MB: partitioned " + ", ".join(f"{r['peak_bytes'] / 1e6:.0f}" for r in part)
          + "; whole " + ", ".join(f"{r['peak_bytes'] / 1e6:.0f}" for r in whole) + f"; model {model_bytes / 1e6:.0f}")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    worker(*sys.argv[1:4])
    os._exit(0)  # skip the interpreter teardown (a ZeRO-3 rank once aborted in it; tests/dist_worker.py)


def test_gpt_oss_loads_flex_attention_on_cuda_and_eager_elsewhere(gptoss_dir, tiny_dir):
    """attn_implementation auto picks, from the class transformers builds (5.23:
    GptOssPreTrainedModel._supports_sdpa = False, _supports_flex_attn = True), flex_attention for gpt-oss on
    CUDA, which never holds eager's (heads, T, T) scores; the model's default on a CPU (transformers' flex path
    cannot apply gpt-oss's sinks there) and for a model with SDPA. The name reaches from_pretrained: the loaded
    config says flex_attention (the forward itself needs a GPU: scripts/gpu_check.py)."""
    from rftlib.models.loading import attention_for, load_model_and_tokenizer
    from rftlib.models.memory import pick_attention

    assert attention_for(str(gptoss_dir), "auto", "cuda") == "flex_attention"
    assert attention_for(str(gptoss_dir), "auto", "cpu") is None  # transformers' default: eager
    assert attention_for(str(tiny_dir), "auto", "cuda") is None  # Llama: sdpa, its default
    assert attention_for(str(gptoss_dir), "eager", "cuda") == "eager"  # asked for: as asked
    assert pick_attention("auto", default="eager", flex=False, device_type="cuda") == "eager"  # no flex: eager
    model, _ = load_model_and_tokenizer(str(gptoss_dir), "float32", attn_implementation="flex_attention")
    assert model.config._attn_implementation == "flex_attention"
