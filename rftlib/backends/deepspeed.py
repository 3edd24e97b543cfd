"""``deepspeed`` backend: DeepSpeed's engine with ZeRO-2/3 and optional CPU offload (seed 003).

rftlib writes no sharding of its own: it derives a DeepSpeed config from RunConfig
(:func:`deepspeed_config`, optionally merged over a user's JSON template in params/deepspeed/),
hands ``deepspeed.initialize`` the PolicyForward module, and calls the engine's documented
``backward``/``step``/``save_checkpoint``/``load_checkpoint``. DeepSpeed counts micro-steps
itself: ``gradient_accumulation_steps`` is the number of micro-batches a rank runs per optimizer
step, and ``engine.step()`` after each micro-batch only steps the optimizer on the last one.

The loss the loop hands ``backward`` is already normalised by the *global* batch totals, so it is
back-propagated without DeepSpeed's division by the accumulation steps (``scale_wrt_gas=False``).

Runs here on CPU ranks (``DS_ACCELERATOR=cpu``, gloo); on GPUs the same code with NCCL.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import torch

from rftlib.models.forward import PolicyForward
from rftlib.models.loading import cpu_adam_probe, import_deepspeed  # deepspeed's one place (the partitioned load needs it too)
from rftlib.settings import ScaleSettings
from rftlib.backends import Backend, BackendInputs, Sharding, zero_rules
from rftlib.backends.scheduler import make_scheduler

DS_TAG = "ds"  # the tag of the one DeepSpeed checkpoint inside a step directory


def _merge(base: dict, over: dict) -> dict:
    """``over`` merged into ``base`` recursively (``over`` wins)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def deepspeed_config(inputs: BackendInputs, world_size: int, micro_steps: int) -> dict:
    """The DeepSpeed config for a run's settings: the user's template (``deepspeed_config``) under the values
    rftlib must control (batch sizes, clipping, ZeRO stage, offload, precision, optimizer).

    micro_steps: micro-batches per rank per optimizer step, so that
    train_batch_size = micro_batch_size x micro_steps x world_size = train_prompts x G sequences.
    """
    scale, optim = inputs.scale, inputs.optim
    template: dict = {}
    if scale.deepspeed_config:
        path = Path(scale.deepspeed_config)
        try:
            template = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"deepspeed_config: no file {path}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"deepspeed_config {path}:{e.lineno}:{e.colno}: malformed JSON: {e.msg}") from None
    zero: dict = {"stage": scale.zero_stage}
    if scale.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    if scale.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    derived = {
        "train_micro_batch_size_per_gpu": optim.micro_batch_size,
        "gradient_accumulation_steps": micro_steps,
        "train_batch_size": optim.micro_batch_size * micro_steps * world_size,
        "gradient_clipping": optim.max_grad_norm,
        "zero_optimization": zero,
        "bf16": {"enabled": inputs.model.dtype == "bfloat16"},
        "fp16": {"enabled": inputs.model.dtype == "float16"},
        "optimizer": {"type": "AdamW", "params": {
            "lr": optim.lr, "betas": [optim.adam_beta1, optim.adam_beta2], "eps": 1e-8, "weight_decay": optim.weight_decay,
            # torch's AdamW unless the optimizer is offloaded (then DeepSpeed's CPU Adam); FusedAdam
            # needs a compiled op
            "torch_adam": not scale.offload_optimizer, "adam_w_mode": True}},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    return _merge(template, derived)


def deepspeed_config_for(inputs: BackendInputs, world_size: int) -> dict:
    """The config DeepSpeedBackend will run for a run's settings on ``world_size`` ranks (also what a ZeRO-3 model is
    loaded partitioned under, rftlib.models.loading.load_policy)."""
    return deepspeed_config(inputs, world_size, inputs.train_prompts * inputs.rollout.n_samples_per_prompt
                            // world_size // inputs.optim.micro_batch_size)


def cpu_adam_build_problems(facts: dict) -> list[str]:
    """The sentence (a list of one) saying what this machine lacks for DeepSpeed's CPU Adam and how to get it,
    from rftlib.models.loading.cpu_adam_probe's facts; [] when it is prebuilt or can be built."""
    if facts["unavailable"]:
        return [f"offload_optimizer: {facts['unavailable']}"]
    if facts["prebuilt"]:
        return []
    missing, fixes = [], []
    if not facts["ninja"]:
        missing.append("ninja")
    if not facts["cxx"]:
        missing.append("a C++ compiler (c++, or $CXX)")
    if missing:
        fixes.append("`conda install -c conda-forge ninja cxx-compiler` (or your system's ninja and g++)")
    if facts["needs_cuda"]:
        cuda = []
        if not facts["cuda_home"] or not facts["nvcc"]:
            cuda.append("the CUDA compiler (nvcc under CUDA_HOME: "
                        f"{facts['cuda_home'] or 'not set, and no nvcc on PATH or in /usr/local/cuda'})")
        if not facts["curand"]:
            cuda.append("libcurand (the CUDA toolkit's random-number library)")
        if cuda:
            missing += cuda
            fixes.append("the CUDA toolkit of torch's CUDA version (`conda install -c nvidia cuda-nvcc "
                         "cuda-libraries-dev`, then `export CUDA_HOME=$CONDA_PREFIX`)")
    if not missing:
        return []
    return ["offload_optimizer builds DeepSpeed's CPU Adam when the optimizer is created (after the model has "
            f"loaded), and this machine lacks {', '.join(missing)}: install {' and '.join(fixes)}; or install "
            "DeepSpeed with the op prebuilt (`DS_BUILD_CPU_ADAM=1 pip install deepspeed==0.19.8`, on a machine "
            "with them); or train without it (offload_optimizer: false, where the GPUs hold the optimizer state)"]


def cpu_adam_problems() -> list[str]:
    """:func:`cpu_adam_build_problems` of this machine (:func:`cpu_adam_probe`)."""
    return cpu_adam_build_problems(cpu_adam_probe())


class DeepSpeedBackend(Backend):
    name = "deepspeed"
    needs_group_alone = True  # deepspeed.initialize insists on a process group, even for one process
    # DeepSpeed steps the optimizer after gradient_accumulation_steps micro-batches, a count fixed at
    # initialize: the loop must run exactly that many per optimizer batch (no zero-advantage row skipping)
    fixed_micro_steps = True
    micro_step_grads = False  # gradients live in DeepSpeed's buffers (partitioned): no per-micro-batch p.grad (GNS probe)

    check_config = staticmethod(zero_rules)  # declared with the name (rftlib.backends), read by the config

    @staticmethod
    def check_machine(inputs: BackendInputs) -> list[str]:
        """offload_optimizer: DeepSpeed's CPU Adam must build or load here (:func:`cpu_adam_problems`)."""
        return cpu_adam_problems() if inputs.scale.offload_optimizer else []

    @staticmethod
    def sharding(inputs: BackendInputs) -> Sharding:
        scale = inputs.scale
        return Sharding(zero_stage=scale.zero_stage, offload_params=scale.offload_params,
                        offload_optimizer=scale.offload_optimizer)

    @staticmethod
    def join_group(pg_backend: str, device: torch.device) -> None:
        """DeepSpeed's own init_distributed (it records the group its engine and zero.Init use)."""
        import_deepspeed("backend 'deepspeed'").init_distributed(dist_backend=pg_backend)

    @staticmethod
    def plan_generation_gather(inputs: BackendInputs, model_bytes: int, free_bytes: int) -> tuple[bool, str] | None:
        """ZeRO-3: :func:`gather_fits`; below it every rank holds the whole model (None)."""
        return gather_fits(inputs.scale, model_bytes, free_bytes) if inputs.scale.zero_stage == 3 else None

    @staticmethod
    def partitioned_load_config(inputs: BackendInputs, world_size: int) -> dict | None:
        """ZeRO-3 loads the policy partitioned under the config it will run (no rank ever holds the whole
        model: seed 003's actor patch); ZeRO-1/2 keep whole weights on every rank."""
        return deepspeed_config_for(inputs, world_size) if inputs.scale.zero_stage == 3 else None

    @property
    def partitions_params(self) -> bool:
        """ZeRO-3 over several ranks: each rank holds a shard of every weight (generation steps in lock-step)."""
        return self.scale.zero_stage == 3 and self.dist.distributed

    def __init__(self, inputs: BackendInputs, dist, model, *, total_opt_steps: int, warmup_steps: int):
        ds = import_deepspeed("backend 'deepspeed'")
        self.inputs, self.scale, self.dist, self.model, self.ds = inputs, inputs.scale, dist, model, ds
        self.config = deepspeed_config_for(inputs, dist.world_size)
        self.micro_steps = self.config["gradient_accumulation_steps"]
        self.policy = PolicyForward(model)
        params = [p for p in model.parameters() if p.requires_grad]
        self.engine, self.optimizer, _, self.scheduler = ds.initialize(
            model=self.policy, model_parameters=params, config=self.config,
            lr_scheduler=lambda opt: make_scheduler(opt, total_steps=total_opt_steps, warmup_steps=warmup_steps,
                                                    min_lr_ratio=inputs.optim.min_lr_ratio))
        self.params = params
        self._last = True

    def forward(self, **rows):
        return self.engine(**rows)

    def generation_gather(self):
        """(the context HF generate enters once per rollout, or None; why, in words): ZeRO-3 gathers the whole
        model for a rollout when :func:`gather_fits` says so (zero3_gather_for_generation)."""
        if self.scale.zero_stage != 3:
            return None, ""
        model_bytes = sum(getattr(p, "ds_numel", p.numel()) * p.element_size() for p in self.model.parameters())
        # one decision for every rank (the gather is a collective): the tightest rank's free memory
        free = min(self.dist.gather_objects(free_memory_bytes(self.dist.device)))
        on, why = gather_fits(self.scale, model_bytes, free)
        return (self.gathered_for_generation if on else None), why

    @contextlib.contextmanager
    def gathered_for_generation(self):
        """The whole model gathered on every rank for one rollout's generate, then re-partitioned (ZeRO-3).

        Without it HF generate runs DeepSpeed's per-module hooks at every decode step: each layer is
        all-gathered and released T times a rollout. Here every parameter is gathered once
        (``deepspeed.zero.GatheredParameters``), the ZeRO-3 module hooks are taken off for the block (they
        would fetch and release parameters that are already whole) and put back after, as TRL's
        ``unwrap_model_for_generation(gather_deepspeed3_params=True)`` does. Needs the whole model's
        weights in this rank's memory for the block (:func:`gather_fits`). A no-op below ZeRO-3.
        """
        if self.scale.zero_stage != 3:
            yield
            return
        offload = _zero3_offload(self.engine)
        with self.ds.zero.GatheredParameters(list(self.model.parameters())):
            _remove_zero3_hooks(offload)
            try:
                yield
            finally:
                _add_zero3_hooks(offload)

    def accumulate(self, last: bool):
        self._last = last
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)  # the loss is already a share of the global mean
        if not self._last:
            self.engine.step()  # DeepSpeed's micro-step bookkeeping: no optimizer step before the boundary

    def step(self, loss_finite: bool) -> tuple[float, bool]:
        """The boundary step: DeepSpeed reduces, clips (gradient_clipping) and steps optimizer + LR."""
        if not loss_finite:
            # DeepSpeed skips steps only on fp16 overflow; stepping a bf16/fp32 NaN gradient would poison
            # every later checkpoint, so stop here with the last checkpoint intact
            raise FloatingPointError("non-finite loss under the deepspeed backend: stopping before the optimizer "
                                     "step (weights and the last checkpoint unchanged); lower lr / eps_clip")
        self.engine.step()
        g = self.engine.get_global_grad_norm()
        grad_norm = float(g) if g is not None else float("nan")
        return grad_norm, math.isfinite(grad_norm)

    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def train(self, mode: bool = True) -> None:
        self.engine.train(mode)

    # ---- checkpoints --------------------------------------------------------------------------
    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Full trainable tensors (gathered from their ZeRO-3 shards on every rank; a collective)."""
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        with self.ds.zero.GatheredParameters([p for _, p in named], enabled=self.scale.zero_stage == 3):
            return {n: p.detach().to("cpu", copy=True) for n, p in named}

    def adapter_state(self) -> dict[str, torch.Tensor] | None:
        return self.trainable_state()

    def save(self, tmp: Path) -> None:
        """Every rank writes its partition (DeepSpeed's own checkpoint; frozen base weights excluded) unless
        ``deepspeed_checkpoint`` is off; rank 0 writes the gathered trainable tensors and the LR schedule."""
        state = self.trainable_state()  # collective: every rank takes part
        if self.scale.deepspeed_checkpoint:
            self.engine.save_checkpoint(str(tmp / "deepspeed"), tag=DS_TAG, exclude_frozen_parameters=True)
        if self.dist.is_main:
            torch.save(state, tmp / "trainable.pt")
            torch.save(self.scheduler.state_dict(), tmp / "scheduler.pt")

    def full_grads(self) -> list:
        """DeepSpeed keeps the gradients in its own partitions, not in ``p.grad`` (the replay's table read 0 there):
        ``deepspeed.utils.safe_get_full_grad`` gathers each parameter's (ZeRO-3: an all-gather per parameter,
        every rank in the same order)."""
        get = import_deepspeed("rft replay's gradient table").utils.safe_get_full_grad
        return [get(p) for p in self.params]

    @staticmethod
    def checkpoint_holds_optimizer(d: Path) -> bool:
        """DeepSpeed's own checkpoint (weights, optimizer partitions) is written under ``d / 'deepspeed'``."""
        return (d / "deepspeed").exists()

    def load(self, d: Path) -> None:
        """DeepSpeed's checkpoint when the step has one (exact: weights, optimizer partitions, schedule);
        else the trainable tensors scattered into their partitions and the LR schedule, with fresh AdamW
        moments (what a seed-003 --disable_ds_ckpt checkpoint can give)."""
        if (d / "deepspeed").exists():
            path, _ = self.engine.load_checkpoint(str(d / "deepspeed"), tag=DS_TAG, load_module_strict=False)
            if path is None:
                raise FileNotFoundError(f"no DeepSpeed checkpoint under {d / 'deepspeed'}")
            return
        if not (d / "trainable.pt").exists():
            raise FileNotFoundError(f"{d} has neither a DeepSpeed checkpoint nor trainable.pt to resume from")
        self.load_trainable(torch.load(d / "trainable.pt", weights_only=True, map_location="cpu"), d / "trainable.pt")
        self.scheduler.load_state_dict(torch.load(d / "scheduler.pt", weights_only=False))
        if self.dist.is_main:
            print(f"[rft] resumed {d.name} without a DeepSpeed checkpoint (deepspeed_checkpoint: false): the weights "
                  "and LR schedule are restored, AdamW's moments start again from zero", flush=True)

    def load_trainable(self, state: dict[str, torch.Tensor], where: str | Path = "the state") -> None:
        """The whole trainable tensors ``state`` written into this rank's partitions: gathered (a collective: every
        rank calls it), rank 0 writes, DeepSpeed scatters on exit (rft replay from a record's snapshot, a resume
        without a DeepSpeed checkpoint). A full tensor ``copy_``'d into a ZeRO-3 placeholder fails on its shape."""
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        missing = [n for n, _ in named if n not in state]
        if missing:
            raise KeyError(f"{where} lacks trainable parameters of this model: {missing[:3]}")
        with self.ds.zero.GatheredParameters([p for _, p in named], modifier_rank=0, enabled=self.scale.zero_stage == 3):
            if self.dist.is_main or self.scale.zero_stage != 3:  # ZeRO-3: rank 0 writes, DeepSpeed scatters on exit
                with torch.no_grad():
                    for n, p in named:
                        p.copy_(state[n].to(p.device, p.dtype))

    def close(self) -> None:
        pass


def _zero3_offload(engine):
    """The object holding a ZeRO-3 engine's module hooks (DeepSpeedZeRoOffload; DeepSpeed 0.19's
    ``optimizer.parameter_offload``)."""
    opt = engine.optimizer
    offload = getattr(opt, "parameter_offload", opt)
    if offload is None or not hasattr(offload, "forward_hooks"):
        raise RuntimeError("ZeRO-3 engine without parameter-offload hooks: cannot gather for generation "
                           "(set zero3_gather_for_generation: off)")
    return offload


def _remove_zero3_hooks(offload) -> None:
    """Take ZeRO-3's fetch/release hooks off every module (DeepSpeedZeRoOffload.forward_hooks/backward_hooks)
    and clear each parameter's record of the modules using it, so no hook runs during generate."""
    for p in offload.module.parameters(recurse=True):
        p.ds_active_sub_modules.clear()
    for hook in [*offload.forward_hooks, *offload.backward_hooks]:
        hook.remove()
    offload.forward_hooks, offload.backward_hooks = [], []


def _add_zero3_hooks(offload) -> None:
    """Put ZeRO-3's module hooks back; the prefetch trace recorded before generate no longer matches the
    module order the update will see, so it is invalidated (re-recorded on the next forward)."""
    coordinator = getattr(offload, "param_coordinator", None)
    if coordinator is not None and not coordinator.is_invalid_trace():
        coordinator._invalidate_trace()
    offload._register_deepspeed_module(offload.module)


def free_memory_bytes(device: torch.device) -> int:
    """Free memory where the gathered model would live: the GPU's (torch.cuda.mem_get_info), else the host's
    MemAvailable (/proc/meminfo; 0 where it cannot be read, so auto does not gather)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def gather_fits(scale: ScaleSettings, model_bytes: int, free_bytes: int) -> tuple[bool, str]:
    """Whether HF generate under ZeRO-3 gathers the whole model once per rollout
    (``zero3_gather_for_generation``), and why, in words for the plan and the step log.

    auto gathers when the whole model's weights take at most half the device's free memory (the other
    half: the rollout's KV cache and activations, and the gather's own transient buffers)."""
    mode = scale.zero3_gather_for_generation
    gib = f"{model_bytes / 2**30:.1f} GiB of weights, {free_bytes / 2**30:.1f} GiB free"
    if scale.backend != "deepspeed" or scale.zero_stage != 3:
        return False, "not ZeRO-3: every rank holds the whole model already"
    if mode == "on":
        return True, f"gather once per rollout (zero3_gather_for_generation: on; {gib})"
    if mode == "off":
        return False, f"per-layer gathers at every decode step (zero3_gather_for_generation: off; {gib})"
    if scale.offload_params:
        return False, "per-layer gathers at every decode step (auto: offload_params means the model does not fit)"
    fits = 2 * model_bytes <= free_bytes
    return fits, (f"gather once per rollout (auto: {gib})" if fits else
                  f"per-layer gathers at every decode step (auto: the whole model does not fit: {gib})")


