"""The builder (rftlib.train.build) and the registries it picks from: a Trainer that receives its parts,
a task handed in with its own reward, and a toy engine and a toy backend registered by name."""

from __future__ import annotations

import os

import pytest
import torch

from rftlib.attempts import lock_attempt
from rftlib.config import ConfigError, make_config
from rftlib.data.arithmetic import all_problems
from rftlib.data.base import Task
from rftlib.rollout.factory import ENGINES, EngineInputs, engine_kind, make_engine, register_engine
from rftlib.rollout.hf import HFEngine
from rftlib.backends import BACKENDS, BackendInputs
from rftlib.backends.torch_backend import TorchBackend
from rftlib.train.build import build
from rftlib.train.loop import Trainer


def _trainable(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}


def test_a_trainer_receives_its_parts_and_trains_the_task_it_is_given(tiny_cfg):
    """A Task with its own reward goes into build(), the Trainer gets the parts."""
    probs = all_problems()
    scored = []

    def reward(text, example, truncated):  # varies with the completion: non-zero advantages
        scored.append(example.id)
        return float(len(text) % 2), {"correctness": 0.0}

    task = Task(name="toy", train=probs[:20], eval=probs[20:24], reward=reward)
    cfg = tiny_cfg(num_steps=1, eval_steps=0, save_steps=0, warmup_ratio=0.0)  # warmup's first step is at LR 0
    parts = build(cfg, task=task)
    tr = Trainer(cfg, parts=parts, progress=False)
    try:
        assert tr.task is task and tr.model is parts.model and tr.engine is parts.engine and tr.reward is None
        before = _trainable(tr.model)
        row = tr.step()
        after = _trainable(tr.model)
    finally:
        tr.close()
    assert len(scored) == cfg.rollout_batch_size * cfg.n_samples_per_prompt
    assert set(scored) <= {e.id for e in probs[:20]}  # the handed-in pool, not the registry's arithmetic task
    assert row["advantage_max"] > 0 > row["advantage_min"]
    assert any(not torch.equal(before[k], after[k]) for k in before), "no trainable tensor changed"


def test_a_failed_build_releases_the_attempt_lock(tiny_cfg, tmp_path):
    """A notebook kernel lives on after a failed build: the attempt must not stay locked by it."""
    run_dir = tmp_path / "attempt"
    with pytest.raises(ConfigError, match="every training prompt is longer") as failed:
        build(tiny_cfg(prompt_max_len=1), run_dir)  # fails after the lock is taken (prompts fitted after the model)
    # the traceback keeps build()'s frame, and so its open lock file, alive: only an explicit release frees it
    assert failed.value.__traceback__ is not None
    lock_attempt(run_dir, wait=0).close()  # nobody holds it


class RecordingEngine(HFEngine):
    """A toy engine: HF generate, counting its calls and keeping the backend it was built with."""

    def __init__(self, *a, backend=None, **kw):
        super().__init__(*a, **kw)
        self.backend, self.calls = backend, 0

    def generate(self, prompts, **kw):
        self.calls += 1
        return super().generate(prompts, **kw)


def test_a_registered_toy_engine_is_built_by_name_and_runs_the_rollouts(monkeypatch, tiny_cfg):
    with pytest.raises(ConfigError, match="rollout_engine='recording': choose hf, vllm"):
        tiny_cfg(rollout_engine="recording")
    monkeypatch.setattr(ENGINES, "_table", dict(ENGINES._table))

    @register_engine("recording", on_trainer_module=True)
    def _recording(inputs, model, tok, run_dir, backend):
        return RecordingEngine(model, tok, backend=backend)

    assert engine_kind("recording").on_trainer_module  # declared before any engine is built

    cfg = tiny_cfg(rollout_engine="recording", num_steps=1, eval_steps=0, save_steps=0)
    tr = Trainer(cfg, progress=False)
    try:
        assert isinstance(tr.engine, RecordingEngine) and tr.engine.backend is tr.backend  # its needs: the backend
        tr.step()
        assert tr.engine.calls == 1
    finally:
        tr.close()


def test_the_hf_engine_reads_lockstep_generation_off_the_backend(tiny_cfg):
    """An engine names its own needs: HF generate on the module runs in lock-step (synced_gpus) exactly
    when the backend partitions the parameters across ranks (ZeRO-3), whatever the backend is called."""
    from rftlib.models.loading import load_model_and_tokenizer

    cfg = tiny_cfg()
    model, tok = load_model_and_tokenizer(cfg.model, "float32")
    for partitioned in (False, True):
        backend = type("B", (), {"partitions_params": partitioned, "generation_gather": lambda self: (None, "")})()
        assert make_engine(EngineInputs.of(cfg.section), model, tok, None, backend=backend).synced_gpus is partitioned
    # and it generates inside the whole-model gather the backend offers (ZeRO-3's gather-once), when it offers one
    gather = object()
    backend = type("B", (), {"partitions_params": True, "generation_gather": lambda self: (gather, ""),
                             "dist": type("D", (), {"is_main": True})()})()
    assert make_engine(EngineInputs.of(cfg.section), model, tok, None, backend=backend).gather is gather
    assert make_engine(EngineInputs.of(cfg.section), model, tok, None).synced_gpus is False  # no backend: one process


class CountingBackend(TorchBackend):
    """A toy backend: the single-process torch backend, counting optimizer steps."""

    name = "counting"

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.steps = 0

    def step(self, loss_finite: bool):
        self.steps += 1
        return super().step(loss_finite)


def test_a_registered_toy_backend_is_built_by_name_and_steps_the_optimizer(monkeypatch, tiny_cfg):
    with pytest.raises(ConfigError, match="backend='counting': choose ddp, deepspeed, single"):
        tiny_cfg(backend="counting")
    monkeypatch.setattr(BACKENDS, "_table", dict(BACKENDS._table))
    BACKENDS.register("counting")(CountingBackend)
    cfg = tiny_cfg(backend="counting", num_steps=1, eval_steps=0, save_steps=0)
    assert make_config("tiny", {"backend": "counting"}).backend == "counting"
    tr = Trainer(cfg, progress=False)
    try:
        tr.step()
        assert isinstance(tr.backend, CountingBackend) and tr.backend.steps == cfg.optimizer_steps_per_rollout
    finally:
        tr.close()


def test_a_full_weight_sync_of_partitioned_weights_is_refused(monkeypatch, tiny_cfg):
    """Without LoRA an engine that is not the trainer's module gets model.state_dict(): under ZeRO-3 over
    several ranks those are empty shards, so the builder refuses before the first sync (a LoRA policy, or a
    backend that holds whole weights, is built as before)."""
    from rftlib.train.build import check_full_weight_sync

    class Partitioned(CountingBackend):
        partitions_params = True

    separate = type("E", (), {"shares_trainer_module": False})()
    monkeypatch.setattr(BACKENDS, "_table", dict(BACKENDS._table))
    BACKENDS.register("partitioned")(Partitioned)
    with pytest.raises(ConfigError, match="does not gather the partitioned weights"):
        build(tiny_cfg(backend="partitioned", lora_rank=0), engine=separate)
    cfg = tiny_cfg(lora_rank=0)
    parts = build(cfg)
    try:
        check_full_weight_sync(parts.backend, separate, parts.model)  # whole weights: the sync reads them
        check_full_weight_sync(Partitioned, parts.engine, parts.model)  # the trainer's own module: nothing moves
    finally:
        parts.lock.close()


def test_zero3_full_fine_tuning_refuses_what_would_read_placeholder_weights(tiny_cfg):
    """ZeRO-3 replaces every parameter by an empty placeholder, on one rank too. Full fine-tuning (lora_rank 0)
    there with beta > 0 deep-copied those placeholders as the KL reference (`rft train -p tiny --set
    backend=deepspeed --set zero_stage=3 --set lora_rank=0 --set beta=0.04` on one CPU rank: "'weight' must be
    2-D" at the first reference pass), and with an engine off the trainer's module the full-weight sync read
    model.state_dict() (0-element tensors; the build-time refusal checked several ranks only). Both are
    refused when the config is read, with the settings that work; those settings are accepted."""
    z3 = dict(backend="deepspeed", zero_stage=3, lora_rank=0)
    with pytest.raises(ConfigError, match=r"beta=0.04 with zero_stage 3 and full fine-tuning \(lora_rank 0\): the KL "
                                          r"reference would be a copy .* use LoRA .*, zero_stage 2, or beta 0"):
        tiny_cfg(**z3, beta=0.04)
    with pytest.raises(ConfigError, match=r"rollout_engine 'vllm' with zero_stage 3 and full fine-tuning .*"
                                          r"\(one rank included\), so the engine would get 0-element tensors"):
        tiny_cfg(**z3, rollout_engine="vllm")
    assert tiny_cfg(**z3).lora_rank == 0  # beta 0, HF generate on the module: nothing reads whole weights
    tiny_cfg(**{**z3, "lora_rank": 8}, beta=0.04, rollout_engine="vllm")  # LoRA: adapter disabled, adapter gathered
    tiny_cfg(**{**z3, "zero_stage": 2}, beta=0.04, rollout_engine="vllm")  # ZeRO-2 keeps whole weights


def test_a_backend_and_an_engine_bring_their_own_config_rules(monkeypatch, tiny_cfg):
    """The config asks the registered backend and engine for their rules (Backend.check_config,
    EngineKind.check_config) instead of naming them: a toy pair's rules refuse a config with their words."""
    monkeypatch.setattr(BACKENDS, "_table", dict(BACKENDS._table))
    monkeypatch.setattr(ENGINES, "_table", dict(ENGINES._table))

    class Strict(CountingBackend):
        @staticmethod
        def check_config(inputs: BackendInputs):
            lr = inputs.optim.lr
            return [f"lr={lr}: the strict backend takes lr <= 1e-3"] if lr > 1e-3 else []

    BACKENDS.register("strict")(Strict)
    register_engine("short", on_trainer_module=True,
                    check_config=lambda inputs: ["max_new_tokens over 8"] if inputs.rollout.max_new_tokens > 8 else [])(
        lambda inputs, model, tok, run_dir, backend: HFEngine(model, tok))
    with pytest.raises(ConfigError, match="the strict backend takes lr <= 1e-3"):
        tiny_cfg(backend="strict", lr=1e-2)
    with pytest.raises(ConfigError, match="max_new_tokens over 8"):
        tiny_cfg(rollout_engine="short", max_new_tokens=12)
    assert tiny_cfg(backend="strict", lr=1e-4, rollout_engine="short", max_new_tokens=8).backend == "strict"
    # the built-in rules live with their owners too: offload is ZeRO's, greedy n > 1 is the HF engine's
    with pytest.raises(ConfigError, match="offload_params/offload_optimizer need backend: deepspeed"):
        tiny_cfg(offload_optimizer=True)
    with pytest.raises(ConfigError, match="HF greedy samples are identical"):
        tiny_cfg(eval_n_samples={"heldout": 4})


def _named_outside(root, owner: str, names: set[str], fields: set[str]) -> list[str]:
    """file:line of every place outside ``owner`` that spells one of ``names`` as a string or compares a config
    field of ``fields`` with a string: what 'chosen from a registry, never branched on by name' rules out."""
    import ast

    hits = []
    for path in sorted((root / "rftlib").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(owner):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                hits.append(f"{rel}:{node.lineno} {node.value!r}")
            if isinstance(node, ast.Compare) and any(
                    isinstance(x, ast.Attribute) and x.attr in fields for x in [node.left, *node.comparators]) and any(
                    isinstance(x, ast.Constant) and isinstance(x.value, str) for x in [node.left, *node.comparators]):
                hits.append(f"{rel}:{node.lineno} compares {ast.unparse(node)}")
    return hits


def test_no_module_outside_its_package_names_a_backend_or_branches_on_an_engine(tmp_path):
    """Only rftlib/backends names 'deepspeed' or compares cfg.backend with a name,
    only rftlib/rollout compares cfg.rollout_engine with one. attempts.PACKAGES lists installed distributions
    for an attempt's provenance (the package, not the backend): the one allowed spelling."""
    import shutil
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    allowed = {"rftlib/attempts.py"}
    backends = [h for h in _named_outside(root, "rftlib/backends/", {"deepspeed"}, {"backend"})
                if h.split(":")[0] not in allowed]
    engines = _named_outside(root, "rftlib/rollout/", set(), {"rollout_engine"})
    assert not backends, backends
    assert not engines, engines
    # and the scan sees a branch where one is planted
    shutil.copytree(root / "rftlib", tmp_path / "rftlib")
    (tmp_path / "rftlib" / "smoke_bad.py").write_text('def f(cfg):\n    return cfg.rollout_engine == "vllm"\n')
    assert _named_outside(tmp_path, "rftlib/rollout/", set(), {"rollout_engine"}) == [
        "rftlib/smoke_bad.py:2 compares cfg.rollout_engine == 'vllm'"]


def _saved_adapter(path, **lora):
    """A LoRA adapter of the tiny model saved with peft (B drawn non-zero, so it moves the model), and the model."""
    from rftlib.models.loading import apply_lora, load_model_and_tokenizer

    torch.manual_seed(0)
    args = {"rank": 16, "alpha": 32, "dropout": 0.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], **lora}
    model = apply_lora(load_model_and_tokenizer("tiny")[0], **args)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.2)
    model.save_pretrained(str(path))
    return str(path), model.eval()


def test_init_adapter_of_another_lora_is_refused_naming_the_difference(tiny_cfg, tmp_path):
    """An adapter saved with lora_alpha 32 loaded into an alpha-16 policy scaled every update by
    half without a word (main loaded it); a rank mismatch failed with a tensor-size error. Each is refused before
    anything loads, naming the field and the --set that builds the adapter's LoRA; the matching LoRA starts exactly
    where the adapter ended; a dropout difference (training noise only) is said and allowed."""
    from rftlib.models.loading import apply_lora, load_adapter_weights, load_model_and_tokenizer

    ad, saved = _saved_adapter(tmp_path / "adapter")
    with pytest.raises(ConfigError, match=r"lora_alpha: the adapter's 32, this attempt's 16.*--set lora_alpha=32"):
        Trainer(tiny_cfg(init_adapter=ad, lora_alpha=16), progress=False)
    with pytest.raises(ConfigError, match=r"\(r: the adapter's 16, this attempt's 8.*--set lora_rank=16"):
        Trainer(tiny_cfg(init_adapter=ad, lora_rank=8), progress=False)
    with pytest.raises(ConfigError, match=r"target_modules: .*--set 'lora_target_modules=\[\"k_proj\",\"o_proj\",\"q_proj\",\"v_proj\"\]'"):
        Trainer(tiny_cfg(init_adapter=ad, lora_target_modules=["q_proj", "v_proj"]), progress=False)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # refused before the attempt
    # the loader refuses too, for a caller that loads an adapter without the builder
    other = apply_lora(load_model_and_tokenizer("tiny")[0], rank=16, alpha=16, dropout=0.0,
                       target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    with pytest.raises(ValueError, match="lora_alpha: the adapter's 32, this attempt's 16"):
        load_adapter_weights(other, ad)
    ids = torch.tensor([[1, 5, 9, 13, 17, 21]])
    with pytest.warns(UserWarning, match=r"trained with lora_dropout=0.0; this attempt trains it with lora_dropout=0.05"):
        tr = Trainer(tiny_cfg(init_adapter=ad, lora_dropout=0.05), progress=False)
    try:
        tr.model.eval()
        with torch.no_grad():
            assert torch.allclose(tr.model(ids).logits, saved(ids).logits, atol=1e-5)  # starts where it ended
            with saved.disable_adapter():  # and the adapter does move the model (a zero B would prove nothing)
                base = saved(ids).logits
            assert not torch.allclose(saved(ids).logits, base, atol=1e-3)
    finally:
        tr.close()


# ---- issue 29 item 6: DeepSpeed's CPU Adam (offload_optimizer) needs a build this machine may not manage ----
CAN_BUILD = dict(unavailable="", prebuilt=False, needs_cuda=False, ninja=True, cxx="/usr/bin/c++", cuda_home=None,
                 nvcc=False, curand=False)
NO_NINJA = {**CAN_BUILD, "ninja": False}


def test_cpu_adam_refusal_names_what_is_missing_and_the_fix():
    """The sentence a researcher gets: what is missing, the conda packages that bring it, and the two other ways
    out (DeepSpeed with the op prebuilt, or no optimizer offload)."""
    from rftlib.backends.deepspeed import cpu_adam_build_problems

    assert cpu_adam_build_problems(CAN_BUILD) == []
    (p,) = cpu_adam_build_problems(NO_NINJA)
    for part in ("lacks ninja", "conda install -c conda-forge ninja cxx-compiler", "DS_BUILD_CPU_ADAM=1",
                 "offload_optimizer: false"):
        assert part in p, part
    (p,) = cpu_adam_build_problems({**CAN_BUILD, "cxx": None})
    assert "lacks a C++ compiler" in p
    # a DeepSpeed whose CPU Adam builder is a CUDA op builder also compiles against the toolkit: nvcc, curand
    (p,) = cpu_adam_build_problems({**CAN_BUILD, "needs_cuda": True})
    assert "nvcc under CUDA_HOME" in p and "libcurand" in p and "conda install -c nvidia cuda-nvcc" in p
    assert cpu_adam_build_problems({**CAN_BUILD, "needs_cuda": True, "cuda_home": "/usr/local/cuda", "nvcc": True,
                                    "curand": True}) == []
    assert cpu_adam_build_problems({**NO_NINJA, "prebuilt": True}) == []  # installed with the op: nothing to build
    (p,) = cpu_adam_build_problems({**CAN_BUILD, "unavailable": "offload_optimizer needs DeepSpeed: `pip ...`"})
    assert p.startswith("offload_optimizer: offload_optimizer needs DeepSpeed")


def test_the_cpu_adam_probe_reads_the_installed_deepspeed():
    """DeepSpeed 0.19.8 (the pinned version) hands every accelerator its CPU builder for CPU Adam
    (deepspeed/accelerator/cuda_accelerator.py: CPUAdamBuilder from op_builder/cpu), a plain C++ build: ninja
    and a compiler, no CUDA toolkit. This machine has both, so the probe finds nothing to refuse."""
    pytest.importorskip("deepspeed")
    from rftlib.backends.deepspeed import cpu_adam_probe, cpu_adam_problems

    facts = cpu_adam_probe()
    assert facts["unavailable"] == "" and facts["needs_cuda"] is False
    assert facts["ninja"] and facts["cxx"] and cpu_adam_problems() == []


def test_offload_optimizer_is_refused_before_the_model_loads(tiny_cfg, monkeypatch):
    """Before the fix the trainer loaded the policy (minutes for gpt-oss-120b) and failed in deepspeed.initialize
    at the CPU Adam build; now it refuses first, with the fix, and joins no process group."""
    import rftlib.backends.deepspeed as dsb
    import rftlib.train.build as build_mod

    monkeypatch.setattr(dsb, "cpu_adam_probe", lambda: NO_NINJA, raising=False)
    monkeypatch.setattr(build_mod, "build_policy", lambda *a, **k: pytest.fail("loaded the model before refusing"))
    # joins no process group: asked of init_dist itself, since an earlier test of the suite may have left one open
    monkeypatch.setattr(build_mod, "init_dist", lambda *a, **k: pytest.fail("joined a process group before refusing"))
    cfg = tiny_cfg(backend="deepspeed", zero_stage=2, offload_optimizer=True)
    with pytest.raises(ConfigError, match=r"cannot run the config's backend: offload_optimizer builds DeepSpeed's "
                                          r"CPU Adam .* lacks ninja"):
        build(cfg)
    assert build_mod.machine_problems(build_mod.backend_inputs(tiny_cfg(backend="deepspeed", zero_stage=2))) == []  # no offload: no build


def test_a_one_rank_group_takes_a_port_of_its_own_over_an_inherited_held_one(tmp_path):
    """A child of a process that ran a one-rank DeepSpeed group inherits MASTER_PORT, still held by the parent's
    store: the child's own one-rank group must not try to listen on it (EADDRINUSE, the GPU check's CPU form in the
    suite)."""
    import socket
    import subprocess
    import sys

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        # a toy backend that joins a one-rank group alone, as DeepSpeed's does (torch's own join: no DeepSpeed import)
        code = ("import torch.distributed as d\n"
                "from rftlib.backends import BACKENDS\n"
                "from rftlib.backends.torch_backend import TorchBackend\n"
                "from rftlib.config import make_config\n"
                "from rftlib.train.dist import init_dist\n"
                "BACKENDS.register('grouped')(type('Grouped', (TorchBackend,), {'needs_group_alone': True}))\n"
                "init_dist(make_config('tiny', {'backend': 'grouped'}))\n"
                "print('joined', d.get_world_size())\n")
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1",
               "LOCAL_RANK": "0"}
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0 and "joined 1" in p.stdout, p.stderr[-2000:]
