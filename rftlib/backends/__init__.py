"""Training backends behind one seam: how the policy module is wrapped, how gradients are reduced
and how the optimizer steps. The loop calls the same methods whichever backend runs it:

    backend.forward(**rows)          (logprobs, entropy) through the wrapped PolicyForward
    with backend.accumulate(last):   gradient sync only on the optimizer batch's last micro-step
    backend.backward(loss)
    backend.step(finite) -> grad_norm   clip, step optimizer + LR schedule (or skip a non-finite step)
    backend.lr() / backend.train(mode) / backend.close()
    backend.save(tmp_dir) / load(step_dir)   this rank's share of a checkpoint
    backend.trainable_state()        the full trainable tensors (gathered under ZeRO-3)
    backend.adapter_state()          the LoRA tensors to hand an engine (gathered), None without LoRA
    backend.generation_gather()      (a context HF generate runs in with the whole model gathered, or None; why)

and reads what a backend declares instead of its name. A backend subclasses :class:`Backend`, whose
class-level declarations answer before anything is built (the config's checks, the memory preflight,
the launch plan, the process group) and default to a backend that holds a whole model on every rank:

    fixed_micro_steps   the optimizer steps after a fixed count of micro-steps (no row skipping)
    micro_step_grads    p.grad holds the running gradient after each micro-step (the GNS probe)
    partitions_params   each rank holds a shard of every weight (generation on the module runs in lock-step)
    needs_group_alone   one process without torchrun still joins a (one-rank) process group
    single_process      runs one process only (refused as a torchrun rank)
    check_config(inputs) -> [problem, ...]  the backend's own rules on a run's settings (offload, ZeRO stage, dtype)
    check_machine(inputs) -> [problem, ...] what this machine lacks to run it (DeepSpeed's CPU Adam build)
    sharding(inputs) -> Sharding            ZeRO stage and CPU offload, for the memory estimates and plans
    partitioned_load_config(inputs, world)  the config to load the policy partitioned under (ZeRO-3), else None
    join_group(pg_backend, device)          how this process joins torch.distributed's group
    plan_generation_gather(inputs, model_bytes, free_bytes) -> (gather?, why) | None   HF generate on shards

``inputs`` is a :class:`BackendInputs`: the sections of the run's settings a backend reads (typed, not the
whole RunConfig), built from a config with ``BackendInputs.of(run_config.section, train_prompts=...)``.
    checkpoint_format   which backends can resume each other's checkpoints (checkpoint_format_of(name))

``single`` and ``ddp`` are torch (rftlib.backends.torch_backend); ``deepspeed`` is DeepSpeed's
engine (ZeRO-2/3, CPU offload), imported only when asked for (DeepSpeed is an optional heavy
dependency, imported in one place: rftlib.models.loading.import_deepspeed).

This module is torch-free: the config checks ``backend`` and the backend's ``check_config`` rules through
``BACKENDS`` without importing torch or DeepSpeed. The built-in backends are declared once, at the end
of this module, by their class's ``"module:attr"`` and their config rules (the classes' ``check_config``
is the same function); ``backend_class`` imports the class on first use.

How to add a backend (one place): a :class:`Backend` subclass with the methods above in its own module
here, declared at the end of this module (``BACKENDS.declare("name", "rftlib.backends.mine:MyBackend",
check_config=...)``), or registered where it is defined with ``BACKENDS.register("name")(MyBackend)``
(its ``check_config`` read off the class; tests/test_train_build.py registers a toy one).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, TypeVar

from rftlib.algo.registry import Registry
from rftlib.rollout.kinds import ENGINES, engine_kind
from rftlib.settings import (EngineSettings, LossSettings, ModelSettings, OptimizationSettings, RolloutSettings,
                             ScaleSettings)

S = TypeVar("S")

BACKENDS = Registry("training backend", declarations_of=lambda cls: {"check_config": cls.check_config})
"""name -> class(inputs, dist, model, *, total_opt_steps, warmup_steps); declares ``check_config`` (the config's
rules)"""


@dataclass(frozen=True)
class BackendInputs:
    """The sections of a run's settings a training backend is declared and built from (typed, not the whole
    RunConfig): what its rules, its declarations and its constructor may read."""

    scale: ScaleSettings  # backend, device, ZeRO stage, offload, the DeepSpeed template and checkpoint
    model: ModelSettings  # dtype
    optim: OptimizationSettings  # lr, Adam betas, weight decay, min_lr_ratio, max_grad_norm, micro_batch_size
    rollout: RolloutSettings  # n_samples_per_prompt (the sequences of one optimizer step)
    loss: LossSettings  # beta (beta > 0 needs a frozen reference policy beside the trained one)
    engine: EngineSettings  # rollout_engine (an engine off the trainer's module is sent the weights)
    train_prompts: int  # prompts per optimizer step (RunConfig.train_prompts, derived there)

    @classmethod
    def of(cls, section: Callable[[type[S]], S], *, train_prompts: int) -> "BackendInputs":
        """Each section field from ``section`` (a config's ``section`` method: section class -> instance)."""
        hints = typing.get_type_hints(cls)
        return cls(**{f.name: section(hints[f.name]) for f in fields(cls) if f.name != "train_prompts"},
                   train_prompts=train_prompts)

CHECKPOINT_FORMATS = {"single": "torch", "ddp": "torch"}
"""backend name -> checkpoint format, where several backends share one (others: their own name)"""


ZERO_BACKEND = "deepspeed"
"""the backend that runs DeepSpeed ZeRO stages and CPU offload: what a caller that asks for ZeRO by
design (rft smoke's ZeRO-3 line, a preset) names, without spelling a backend's name outside this package"""


# ---- the built-in backends' config rules (torch-free: the config reads them before anything is built) ----

def whole_model_rules(inputs: BackendInputs) -> list[str]:
    """A backend that keeps the whole training state on the device (single, ddp): no CPU offload, no CPU fp16."""
    problems = []
    scale = inputs.scale
    if scale.offload_params or scale.offload_optimizer:
        problems.append(f"offload_params/offload_optimizer need backend: {ZERO_BACKEND} (CPU offload is "
                        f"DeepSpeed ZeRO's; backend '{scale.backend}' keeps the training state on the device)")
    if inputs.model.dtype == "float16" and scale.device == "cpu":
        problems.append("dtype float16 on CPU: CPUs have no fast float16 and no GradScaler path; use float32 "
                        "or bfloat16")
    return problems


def zero_rules(inputs: BackendInputs) -> list[str]:
    """ZeRO stage 2 or 3; parameters offload only where ZeRO-3 partitions them. float16 is DeepSpeed's own
    loss-scaled path (on CPU too)."""
    problems = []
    scale = inputs.scale
    if scale.zero_stage not in (2, 3):
        problems.append(f"zero_stage={scale.zero_stage}: rftlib drives DeepSpeed ZeRO stage 2 or 3")
    if scale.offload_params and scale.zero_stage != 3:
        problems.append("offload_params needs zero_stage 3 (ZeRO-2 partitions no parameters to offload)")
    if scale.zero_stage == 3 and inputs.model.lora_rank == 0:
        problems += zero3_full_weight_rules(inputs)
    if scale.zero_stage == 3 and inputs.rollout.env != "single_turn":
        problems.append(f"env='{inputs.rollout.env}' (multi-turn) with zero_stage 3: generating on ZeRO-3 partitions "
                        "is a collective every rank must join call for call, and each rank's episodes end at "
                        "their own turn (rftlib.rollout.multi_turn has no lock-step across ranks yet): use zero_stage "
                        "2, ddp, or a vLLM engine once it is declared able")
    return problems


def zero3_full_weight_rules(inputs: BackendInputs) -> list[str]:
    """Full fine-tuning (lora_rank 0) under ZeRO-3, on any number of ranks (one included: ZeRO-3 replaces every
    parameter by a placeholder whose data is empty and keeps the values in its own partition): what would read
    the module's whole weights. The KL reference is today a deep copy of the policy module (copying the
    placeholders: `'weight' must be 2-D` at the first reference pass), and a full-weight sync to an engine off the
    trainer's module reads ``model.state_dict()`` (0-element tensors sent to the engine). Both refused here, with
    the settings that work; a ZeRO-3 reference engine of its own and a per-parameter gathered sync would lift them."""
    problems = []
    if inputs.loss.beta > 0:
        problems.append(
            f"beta={inputs.loss.beta} with zero_stage 3 and full fine-tuning (lora_rank 0): the KL reference would "
            "be a copy of a policy whose weights ZeRO-3 has partitioned into empty placeholders (it fails at the "
            "first reference pass), and rftlib builds no separate ZeRO-3 reference yet; use LoRA (lora_rank > 0: "
            "the reference is the adapter disabled, no copy), zero_stage 2, or beta 0")
    engine = inputs.engine.rollout_engine
    if engine in ENGINES and not engine_kind(engine).on_trainer_module:  # an unknown name: the config says so
        problems.append(
            f"rollout_engine '{engine}' with zero_stage 3 and full fine-tuning (lora_rank 0): its full-weight sync "
            "reads the module's state_dict, which under ZeRO-3 holds empty placeholders on every rank (one rank "
            "included), so the engine would get 0-element tensors, and rftlib does not gather the weights for the "
            "sync yet; use LoRA (lora_rank > 0: the adapter is gathered), zero_stage 2, or rollout_engine hf")
    return problems


@dataclass(frozen=True)
class Sharding:
    """How a backend lays the training state over ranks and memory, declared from the config alone: read by
    the memory estimates (rftlib.models.memory), the preflight and the launch plan before anything is built."""

    zero_stage: int = 0
    """0: every rank holds whole weights, gradients and optimizer state; 2: gradients and optimizer state
    partitioned; 3: the weights too"""
    offload_params: bool = False
    offload_optimizer: bool = False

    @property
    def label(self) -> str:
        """' ZeRO-3' for a title, '' when nothing is partitioned."""
        return f" ZeRO-{self.zero_stage}" if self.zero_stage else ""


class Backend:
    """The declarations every backend makes, with the defaults of one that keeps a whole model, its gradients
    and its optimizer state on every rank (single, ddp). A subclass overrides what differs; the instance
    methods of the seam (forward, accumulate, backward, step, ...) are the subclass's own."""

    name = "base"
    fixed_micro_steps = False
    micro_step_grads = True
    partitions_params = False
    needs_group_alone = False
    single_process = False  # refuses to run as one of several torchrun ranks (single)

    check_config = staticmethod(whole_model_rules)
    """check_config(inputs) -> problems with a run's settings under this backend, each a sentence naming the field
    (RunConfig's checks add them to the config's error)"""

    @staticmethod
    def sharding(inputs: BackendInputs) -> Sharding:
        return Sharding()

    @staticmethod
    def partitioned_load_config(inputs: BackendInputs, world_size: int) -> dict | None:
        return None

    @staticmethod
    def check_machine(inputs: BackendInputs) -> list[str]:
        """Problems this machine has with running these settings under this backend, found without loading anything
        big (what the backend will build or link at start-up), each a sentence with the fix. The trainer
        refuses them before it loads the model; ``rft launch`` refuses them (a dry run lists them) and ``rft
        preflight`` prints them. [] for a backend that needs nothing beyond torch."""
        return []

    @staticmethod
    def join_group(pg_backend: str, device: torch.device) -> None:
        """Join torch.distributed's group from torchrun's environment (init_dist has set a one-rank one's)."""
        import torch.distributed as tdist

        tdist.init_process_group(backend=pg_backend, device_id=device if device.type == "cuda" else None)

    def full_grads(self) -> list:
        """The whole gradient of each of ``self.params`` (None where it has none), after an optimizer step's
        backward and before it steps: what rft replay's table reads. A backend that partitions gradients gathers
        them here, a collective: every rank calls it. Whole-model backends: ``p.grad`` (DDP has reduced it)."""
        return [p.grad for p in self.params]

    @staticmethod
    def checkpoint_holds_optimizer(d: Path) -> bool:
        """Whether the checkpoint directory ``d`` holds the optimizer state this backend's ``save`` writes (what
        ``load`` restores beyond the weights): a replay of a step after the first of several optimizer steps per
        rollout needs it."""
        return (d / "optimizer.pt").exists()

    @staticmethod
    def plan_generation_gather(inputs: BackendInputs, model_bytes: int, free_bytes: int) -> tuple[bool, str] | None:
        """For HF generate on partitioned weights: (gather the whole model once per rollout?, why), judged from
        the weights' size and the free memory beside them; None where every rank holds whole weights."""
        return None


def checkpoint_format_of(name: str) -> str:
    """The checkpoint format backend ``name`` writes: single and ddp resume each other, DeepSpeed's
    partitioned checkpoints only DeepSpeed."""
    return CHECKPOINT_FORMATS.get(name, name)


def backend_class(name: str):
    """The class registered as ``name``, its module imported on first use."""
    return BACKENDS.get(name)


def check_config(name: str, inputs: BackendInputs) -> list[str]:
    """Problems with a run's settings under backend ``name`` (its declared rules; nothing imported)."""
    return BACKENDS.decl(name)["check_config"](inputs)


def partitioned_load_config(inputs: BackendInputs, world_size: int) -> dict | None:
    """The config under which the policy must be *loaded* partitioned (ZeRO-3: every parameter arrives as
    this rank's shard, rftlib.models.loading.load_policy), or None when the backend wraps a whole model."""
    return backend_class(inputs.scale.backend).partitioned_load_config(inputs, world_size)


def machine_problems(inputs: BackendInputs) -> list[str]:
    """This machine's problems with ``inputs.scale.backend`` running these settings (Backend.check_machine);
    [] when none."""
    return backend_class(inputs.scale.backend).check_machine(inputs)


def sharding_of(inputs: BackendInputs) -> Sharding:
    """The ZeRO stage and CPU offload ``inputs.scale.backend`` runs with (Sharding() for a whole-model backend)."""
    return backend_class(inputs.scale.backend).sharding(inputs)


def make_backend(inputs: BackendInputs, dist, model, *, total_opt_steps: int, warmup_steps: int):
    """Build the backend ``inputs.scale.backend`` names around ``model`` (already on dist.device)."""
    return backend_class(inputs.scale.backend)(inputs, dist, model, total_opt_steps=total_opt_steps,
                                               warmup_steps=warmup_steps)


# ---- the built-in backends, declared once: their classes' "module:attr" (imported on first use) and rules ----
BACKENDS.declare("single", "rftlib.backends.torch_backend:TorchBackend", check_config=whole_model_rules)
BACKENDS.declare("ddp", "rftlib.backends.torch_backend:DDPBackend", check_config=whole_model_rules)
BACKENDS.declare(ZERO_BACKEND, "rftlib.backends.deepspeed:DeepSpeedBackend", check_config=zero_rules)
