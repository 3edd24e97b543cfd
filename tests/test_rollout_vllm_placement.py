"""Where server engines go and how full weights reach them, decided without a GPU or vLLM.

Issue 42 item 5: engines the trainer starts itself (no ``rollout_gpus``) took the first visible GPU, the
trainer's own, at 0.85 utilisation; ``vllm_weight_sync: auto`` chose NCCL whenever on GPUs, also where an
engine shares the trainer's GPU (NCCL refuses two ranks of one group on one device); and full weights went
out as the trainer's float32 masters into a bf16 engine. The planning functions take the visible GPUs as an
argument, and the senders run against stand-ins for the engines' routes and vLLM's transfer classes."""

from __future__ import annotations

import base64
from collections import namedtuple
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load

import rftlib.rollout.vllm_server as vs
from rftlib.config import make_config
from rftlib.rollout.kinds import EngineInputs
from rftlib.rollout.vllm import VLLMSettings, choose_weight_sync, gpu_sets, weight_bytes


def settings(**kw) -> VLLMSettings:
    base = dict(model_dir="stub", dtype="bfloat16", lora_rank=0, max_model_len=512, kv_cache_gib=0.0,
                gpu_memory_utilization=0.85, enforce_eager=False, tensor_parallel_size=1, num_engines=1,
                sleep_mode=False, probe_tol=0.05, seed=0, on_gpu=True)
    return VLLMSettings(**{**base, **kw})


def test_engines_the_trainer_starts_avoid_its_gpu():
    """No rollout_gpus: engine k takes the k-th TP slice of the visible GPUs the trainer does not hold; before
    the fix engine 0 was visible GPU 0, the trainer's."""
    one = settings(trainer_gpus=(0,))
    assert vs.engine_gpus(one, 0, visible=["0", "1"]) == ["1"]
    two_tp2 = settings(trainer_gpus=(1,), num_engines=2, tensor_parallel_size=2)
    vis = ["GPU-a", "GPU-b", "GPU-c", "GPU-d", "GPU-e"]
    assert [vs.engine_gpus(two_tp2, k, visible=vis) for k in (0, 1)] == [["GPU-a", "GPU-c"], ["GPU-d", "GPU-e"]]
    # through CUDA_VISIBLE_DEVICES, as server_env reads it: the trainer on index 0 = physical 4
    assert vs.server_env(one, 0, {"CUDA_VISIBLE_DEVICES": "4,5"})["CUDA_VISIBLE_DEVICES"] == "5"
    with pytest.raises(ValueError, match=r"need 1 GPU\(s\) besides the trainer's GPU\(s\) \[0\], and this process "
                                         r"sees 1 .* set rollout_gpus .* vllm_placement: colocate"):
        vs.engine_gpus(one, 0, visible=["0"])
    # rollout_gpus still decide where they are given (the trainer's GPU included, if the user says so)
    assert vs.engine_gpus(settings(trainer_gpus=(0,), rollout_gpus=(0,)), 0, visible=["0", "1"]) == ["0"]


def test_the_trainer_gpu_comes_from_its_device(tmp_path):
    """A trainer that starts its engines is one rank on ``device`` (cuda:N -> N, cuda -> 0); a launch's
    trainer is on train_gpus, else on the GPUs the plan leaves it (disjoint from the engines')."""
    def inputs(**kw):
        return EngineInputs.of(make_config("tiny", {"runs_root": str(tmp_path), "rollout_engine": "vllm",
                                                    "vllm_placement": "server", **kw}).section)

    assert gpu_sets(inputs(device="cuda:1"), starts_engines=True) == ((1,), ())
    assert gpu_sets(inputs(device="cuda"), starts_engines=True) == ((0,), ())
    assert gpu_sets(inputs(device="cuda", rollout_gpus=[0]), starts_engines=True) == ((0,), (0,))
    assert gpu_sets(inputs(device="cuda", train_gpus=[0, 1]), starts_engines=False) == ((0, 1), (0,))
    assert gpu_sets(inputs(device="cuda", vllm_placement="colocate"), starts_engines=True) == ((), ())


def test_auto_weight_sync_is_nccl_only_between_gpus_of_their_own(tmp_path):
    """NCCL when trainer and engines hold different GPUs; rpc where they share one (before: nccl, which NCCL
    refuses, then a disk fallback writing the whole model every step) and on CPUs; an explicit choice stays."""
    assert choose_weight_sync("auto", on_gpu=True, trainer_gpus=(0,), engine_gpus=(1,)) == "nccl"
    assert choose_weight_sync("auto", on_gpu=True, trainer_gpus=(0,), engine_gpus=(0,)) == "rpc"
    assert choose_weight_sync("auto", on_gpu=True, trainer_gpus=(), engine_gpus=()) == "nccl"  # kept apart by rule
    assert choose_weight_sync("auto", on_gpu=False, trainer_gpus=(), engine_gpus=()) == "rpc"
    assert choose_weight_sync("disk", on_gpu=True, trainer_gpus=(0,), engine_gpus=(0,)) == "disk"

    def launch(**kw):
        cfg = make_config("tiny", {"runs_root": str(tmp_path), "rollout_engine": "vllm", "vllm_placement": "server",
                                   "lora_rank": 0, "device": "cuda", **kw})
        return VLLMSettings.for_launch(EngineInputs.of(cfg.section), on_gpu=True)

    assert launch(rollout_gpus=[1], train_gpus=[0]).weight_sync == "nccl"
    assert launch(rollout_gpus=[0, 1, 2, 3], vllm_num_engines=2,
                  vllm_tensor_parallel_size=2).weight_sync == "nccl"  # seed 003's layout: the trainer on the rest
    shared = launch(train_gpus=[0])  # the plan's default engine GPU is 0: shared with the trainer
    assert shared.weight_sync == "rpc" and "--weight-transfer-config" not in vs.server_command(shared, 0, 8000)
    # the trainer starting its own engine on its own GPU (rollout_gpus [0], the trainer on cuda = cuda:0)
    from rftlib.models.loading import load_model_and_tokenizer
    from rftlib.models.tiny import tiny_model_dir

    model, _ = load_model_and_tokenizer(str(tiny_model_dir()), "float32")
    cfg = make_config("tiny", {"runs_root": str(tmp_path), "rollout_engine": "vllm", "vllm_placement": "server",
                               "lora_rank": 0, "device": "cuda", "rollout_gpus": [0]})
    own = VLLMSettings.from_config(EngineInputs.of(cfg.section), model, tmp_path)
    assert own.weight_sync == "rpc" and own.trainer_gpus == (0,)


class _Model(torch.nn.Module):
    """A float32 'trainer' whose state has a float32 weight and an integer buffer (buffers keep their dtype)."""

    def __init__(self):
        super().__init__()
        self.config = SimpleNamespace(tie_word_embeddings=False)
        self.proj = torch.nn.Linear(4, 3)
        self.register_buffer("steps", torch.tensor([5], dtype=torch.int64))


def test_full_weights_go_out_in_the_engine_dtype_over_rpc(tmp_path):
    """A bf16 engine is sent bf16 tensors (half the bytes), integer buffers as they are; before: float32."""
    posted = []
    srv = SimpleNamespace(post=lambda route, body, what: posted.append((route, body)))
    eng = object.__new__(vs.VLLMServerEngine)
    eng.s, eng.servers = settings(weight_sync="rpc", dtype="bfloat16"), [srv]
    model = _Model()
    eng._load_full(model, tmp_path / "unused")
    sent = {k: v for route, body in posted if body.get("method") == "rftlib_stage_weights"
            for k, v in load(base64.b64decode(body["kwargs"]["payload"])).items()}
    assert {k: v.dtype for k, v in sent.items()} == {"proj.weight": torch.bfloat16, "proj.bias": torch.bfloat16,
                                                     "steps": torch.int64}
    assert torch.equal(sent["proj.weight"], model.proj.weight.detach().to(torch.bfloat16))
    assert model.proj.weight.dtype == torch.float32  # the trainer's masters stay as they were
    # what the sync reports as moved: 12 + 3 weights x 2 B + one int64
    assert weight_bytes(model, eng.wire_dtype) == 15 * 2 + 8


def test_full_weights_go_out_in_the_engine_dtype_over_nccl(monkeypatch):
    """vLLM's NCCL transfer allocates the engine's receive buffers from the metadata and broadcasts what the
    source yields: both in the engine's dtype (stand-ins for vLLM 0.32's trainer-side classes record them)."""
    ParamMeta = namedtuple("ParamMeta", "name dtype shape")
    seen = {}

    class Engine:
        @staticmethod
        def trainer_init(info, client, source):
            return SimpleNamespace(send_weights=lambda: seen.update(
                meta={m.name: m.dtype for m in source.metadata()}, sent={n: t.dtype for n, t in source}))

    modules = {"vllm.distributed.weight_transfer.base": SimpleNamespace(ParamMeta=ParamMeta, WeightSource=object),
               "vllm.distributed.weight_transfer.clients": SimpleNamespace(HTTPVLLMWeightSyncClient=lambda url: url),
               "vllm.distributed.weight_transfer.nccl_engine": SimpleNamespace(
                   NCCLTrainerInitInfo=lambda **kw: kw, NCCLTrainerWeightTransferEngine=Engine)}
    monkeypatch.setattr(vs, "import_vllm", lambda module="vllm": modules[module])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    vs.nccl_send_full_weights([SimpleNamespace(url="http://127.0.0.1:1")], _Model(), None, tp=1, dtype=torch.bfloat16)
    want = {"proj.weight": torch.bfloat16, "proj.bias": torch.bfloat16, "steps": torch.int64}
    assert seen["meta"] == want and seen["sent"] == want

