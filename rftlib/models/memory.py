"""Memory arithmetic of a training run: the peak of one GPU, the load-time peak per rank, host RAM per node.

Pure numbers in, numbers out (no torch): rftlib.preflight.memory_check shows these estimates before a launch,
and the trainer logs its own (rftlib.train.step_memory) beside the measured peak, so both read the same
formulas from this one module below them in the package graph (models < train < preflight).

Three seeds lost time to memory: seed 000 OOMed a 40 GB A100 with a 1.5B policy plus a frozen
copy, seed 002 ran a 0.5B model at ~9.5 of 10 GB, seed 003 sized its 20B/120B allocations by hand
(``84 GB bf16 / 4 = 21 GB/GPU``). This module does that arithmetic term by term and says which
term dominates, so the fix (LoRA, checkpointing, chunked logits, smaller micro-batch, ZeRO-3,
offload) can be chosen before a GPU is rented.

Units: GB = 1e9 bytes, as seed 003's arithmetic uses. GPU capacities are the totals nvidia-smi
reports (an "80GB" H100 is 81559 MiB = 85.5 GB). Dimension names: N sequences in one
forward/backward micro-batch, T tokens per sequence (prompt + completion), V vocabulary, L layers,
h hidden size, hq = heads * head_dim, hkv = kv_heads * head_dim, I intermediate (per expert) size.

What each term assumes (``estimate_train_memory``; every number is bytes per GPU):

- weights: ``params * bytes(train_dtype)``. An MXFP4 checkpoint (gpt-oss) is dequantised to the
  training dtype, so it costs the same as a bf16 one on the training GPUs; vLLM keeps it in MXFP4
  (4.25 bits per expert weight: 4-bit values plus one 8-bit scale per 32). /world under ZeRO-3;
  0 on the GPU with ``offload`` (ZeRO-3 parameter offload moves the partitions to CPU RAM).
- reference: a frozen copy of the weights when ``reference="copy"`` (full fine-tuning with a KL
  term); 0 under LoRA, where the reference is the same weights with the adapter disabled.
- LoRA adapter: ``rank * (in + out)`` per targeted linear per layer (``lora_params``), in the
  adapter dtype (peft keeps adapters in fp32 on a half-precision model; DeepSpeed casts them to
  the training dtype).
- gradients: one per trainable parameter, in the trainable weights' dtype. /world under ZeRO-2/3.
- optimizer: AdamW's two moments (m, v), ``optimizer_dtype`` each (fp32 by default; a plain
  ``torch.optim.AdamW`` on bf16 weights keeps them in bf16). /world under ZeRO-1/2/3; 0 with
  ``adam_offload``.
- master weights: an fp32 copy of the trainable parameters, kept by mixed-precision optimizers
  for full fine-tuning in half precision: DeepSpeed bf16/fp16 (partitioned and offloaded like the
  optimizer), and rftlib's single/DDP backends, whose trainable parameters *are* float32 masters with
  their gradients in float32 too (autocast holds the half copies the weights line counts).
- ZeRO-3 gather: under ZeRO-3 the layer being computed is gathered whole, and the next one is
  prefetched: ``2 * largest layer's params * bytes(train_dtype)``. For MoE layers that is every
  expert (the HF gpt-oss experts are fused tensors).
- activations, per token per layer, without checkpointing (what autograd keeps for backward; b =
  bytes(train_dtype); rb = bytes of the residual stream, b except under the torch backends' full
  fine-tuning, where the embedding is a float32 master, autocast leaves the lookup and the residual
  adds alone, and the stream (every layer's input, both norms' in/out) runs float32: rb = 4)::

      rb * 4h + b * (3hq + 3hkv)     attention: norm in/out, q, k, v, roped q/k, attention output
      + 8h                           the fp32 upcast both RMSNorms keep
      + b * 4I                       dense SwiGLU MLP: gate, up, act(gate), act(gate)*up
      | b * (k * (2h + G I) + E)     MoE instead, per routed (token, expert) pair as transformers' experts
                                     run it (grouped_mm, its default, or the per-expert loop: the same
                                     tensors): the token's copy h, the gate/up output 2I (kept by the gate's
                                     backward), the gate's saved tensors, the down projection's input I, its
                                     output h (for the routing weight); G = 7 for gpt-oss's clamped gate
                                     (clamped gate, sigmoid, up + 1, glu), 4 for SwiGLU; router logits E
      + b * heads * (T + 1)          only with eager attention: the softmax output saved for backward
                                     (gpt-oss: the sink logit is one more column)

  times ``N * T * L``. Eager attention also holds, for the layer being computed, ~2 more (heads, T, T)
  score tensors at once (``scores + mask``, the sink concatenation, ``- max``; their gradients in backward)
  and one causal mask per attention pattern (N, 1, T, T) shared by every layer (gpt-oss: full and
  sliding-window): ``N * T * (2 * heads * T + masks * T) * b``. Which attention runs is the run's
  (:func:`pick_attention`, RunConfig.attn_implementation): the model's default (``ModelShape.attention``),
  except that gpt-oss, which has no SDPA path in transformers (``GptOssPreTrainedModel._supports_sdpa =
  False``) but a flex one (``_supports_flex_attn``), runs flex_attention on CUDA (tiled: no scores held);
  eager where it is asked for, and on CPUs (transformers' flex path cannot apply the sinks there).

  With gradient checkpointing (HF: one checkpoint per decoder layer) only each layer's input is kept
  (``rb * h`` per token per layer: seed 000's float32 masters double it) plus, during backward, one
  layer's activations recomputed and their gradients (2 x one layer's share).
- no-grad passes (the reference logprobs when beta > 0, the old logprobs when the update is off-policy):
  a phase of their own before the update, at ``logprob_batch_size`` rows k (auto: max(micro_batch_size, 8),
  fewer where eager scores would not fit ``NOGRAD_BUDGET`` of the memory beside the static terms:
  :func:`nograd_rows`, the trainer's own rule). Per row (:func:`nograd_row_bytes`): the residual stream in
  and out of the layer computed and one layer's intermediates, and with eager attention
  ``NOGRAD_SCORE_COPIES`` = 3 (heads, T, T + 1) score tensors at once (nothing is saved for a backward, but
  transformers' eager_attention_forward holds scores + mask, the sink concatenation and its max-shifted
  copy / softmax together) + the causal masks; plus one logits chunk and its log-softmax (fp32).
- LoRA input casts: when the adapter dtype differs from the activations' dtype, peft casts each
  targeted linear's input to the adapter dtype before ``lora_A``, and that copy is saved for
  backward: ``in_features * bytes(adapter)`` per token per targeted module (x2 with dropout,
  which saves its output). Under checkpointing only the recomputed layer has them.
- logits: ``N * T * V * 4 * logits_copies`` bytes: float32 (N, T, V) tensors alive at the peak.
  ``LOGITS_LEAN`` = 3: fp32 logits and the log_softmax output saved for backward, then two
  gradients in backward while the forward copy is freed. ``LOGITS_NAIVE`` = 6: a hand-written
  loop that keeps ``log_softmax(policy(x).logits)`` and ``log_softmax(ref(x).logits)`` (fp32 logits
  and log-probs of both models, 4 copies) alive into the backward pass (+2 gradients).
  ``logits="chunked"`` (rftlib's ``chunked_logprobs_entropy``) replaces N*T by ``logits_chunk``
  token rows.
- generation KV cache (only when HF ``generate`` runs on this GPU; a phase of its own, not
  concurrent with the backward pass): ``2 * L * kv_heads * head_dim * b * tokens * sequences``
  plus one step's float32 logits (``sequences * V * 4``).
- vLLM: a colocated engine reserves ``gpu_memory_utilization * capacity`` up front.
- overhead: CUDA context, cuBLAS/NCCL workspaces (``overhead_gb``, 0.5 by default).

Loading (``estimate_load_memory``: one rank's GPU while the model loads, and host RAM per node):

- whole load (single, DDP, ZeRO-1/2; and ZeRO-3 before rftlib loaded it partitioned): every rank holds
  ``P * b`` in host RAM (the checkpoint dequantised), then moves all of it to its GPU; DeepSpeed
  partitions only afterwards. gpt-oss-120b: 234 GB per rank on an 80 GB GPU, ~4 x 234 GB of host RAM.
- partitioned load (rftlib.models.loading.load_partitioned, ZeRO-3): each rank holds ``P * b / world``
  (on the GPU, or in host RAM with ``offload``) plus, while a parameter is filled, that parameter
  gathered whole (the largest: one layer's fused experts, 2.1B params for 120b).
- MXFP4 dequantisation buffers (transformers' ``convert_moe_packed_tensors``, on rank 0 alone when
  partitioned, on every rank when whole), for a parameter of n values: the codes (n/2 bytes), int32
  nibble indices (2n), the looked-up values (n/2 x b), the output (n x b) and its transposed copy
  (n x b): ``n * (2.5 + 2.5 b)`` bytes at once.
- host RAM per node (``ranks_per_node`` ranks): the load's holdings above, the offloaded parameter
  partitions (``P * b / world`` per rank with ``offload``), DeepSpeed's CPU Adam with ``adam_offload``
  (fp32 m, v and master copy of the trainable partition: 12 bytes per trainable parameter / world),
  and a per-process allowance (``host_baseline_gb``: Python, torch, CUDA context, NCCL buffers).

The peak is the static terms plus the largest of the training phase (activations, LoRA casts,
logits, gradients), the no-grad phase and the generation phase. Verdict: OOM at >= 100% of capacity, tight at >= 90%,
fits below. The PyTorch caching allocator usually reserves 5-20% beyond what is allocated, so
"tight" runs often show ~95% in nvidia-smi and may OOM on fragmentation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rftlib.settings import ModelSettings, OptimizationSettings, RolloutSettings

GB = 1e9  # bytes; seed 003 writes "84 GB bf16" for 21B params x 4 bytes
MIB = 2**20

BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "mxfp4": 4.25 / 8}  # per parameter / element

# Totals as nvidia-smi reports them (MiB), converted to GB.
GPUS = {
    "RTX3080-10GB": 10240 * MIB / GB,  # seed 002
    "A100-40GB": 40960 * MIB / GB,  # seed 000, Phase 14
    "A100-80GB": 81920 * MIB / GB,
    "H100-80GB": 81559 * MIB / GB,  # seeds 000 (Phase 15) and 003
    "H200-141GB": 143771 * MIB / GB,
}
# CUDA compute capability of each: bfloat16 from 8.0 (Ampere) on (rftlib.models.precision.float16_note)
GPU_CAPABILITY = {"RTX3080-10GB": (8, 6), "A100-40GB": (8, 0), "A100-80GB": (8, 0), "H100-80GB": (9, 0),
                  "H200-141GB": (9, 0)}

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")  # seed 003 §6: attention-only LoRA for MoE models
ALL_LINEAR = ATTENTION + ("gate_proj", "up_proj", "down_proj")  # peft "all-linear" on a dense model

TIGHT = 0.90  # fraction of capacity from which a plan is "tight"
NOGRAD_BUDGET = 0.8  # auto logprob_batch_size with eager attention: rows whose scores fit this share of the free memory
NOGRAD_SCORE_COPIES = 3  # (heads, T, T) tensors alive at once in an eager no-grad forward (module doc)
LOGITS_LEAN = 3.0  # fp32 (N, T, V) copies at the peak of a lean loss (module doc)
LOGITS_NAIVE = 6.0  # ... of a hand-written loop keeping policy and reference logits and log-probs


@dataclass(frozen=True)
class ModelShape:
    """The architecture numbers memory depends on (HF config.json names in the comments)."""

    name: str
    layers: int  # num_hidden_layers (L)
    hidden: int  # hidden_size (h)
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads
    head_dim: int  # head_dim (hidden // heads unless given)
    vocab: int  # vocab_size (V)
    intermediate: int  # intermediate_size, per expert for MoE (I)
    tied_embeddings: bool = False  # tie_word_embeddings: the LM head reuses the embedding matrix
    n_experts: int = 1  # num_local_experts (E); 1 = dense MLP
    experts_per_tok: int = 1  # num_experts_per_tok (k)
    attn_bias: str = "none"  # "none" | "qkv" (Qwen2) | "qkvo" (gpt-oss attention_bias: q, k, v and o)
    attn_sinks: bool = False  # gpt-oss: one learned sink logit per head
    expert_bias: bool = False  # gpt-oss: biases on the expert projections
    checkpoint: str = "bf16"  # how the weights are stored on disk: "bf16", or "mxfp4" (gpt-oss experts)
    attention: str = "sdpa"  # what transformers runs by default: "sdpa", or "eager" (gpt-oss: no SDPA path)
    flex_attention: bool = False  # transformers has a flex-attention path for it (gpt-oss: _supports_flex_attn)
    attention_masks: int = 1  # distinct causal masks eager attention builds (gpt-oss: full + sliding window)
    expert_gate: str = "swiglu"  # MoE gate: "swiglu" (act(gate) * up), or "gpt-oss" (clamped, sigmoid(alpha x), up + 1)
    source: str = ""  # where the numbers come from

    @property
    def hq(self) -> int:
        return self.heads * self.head_dim

    @property
    def hkv(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 1

    def attn_params(self) -> int:
        h, hq, hkv = self.hidden, self.hq, self.hkv
        n = h * hq + 2 * h * hkv + hq * h  # q, k, v, o
        n += {"none": 0, "qkv": hq + 2 * hkv, "qkvo": hq + 2 * hkv + h}[self.attn_bias]
        return n + (self.heads if self.attn_sinks else 0)

    def expert_params(self) -> int:
        """One SwiGLU MLP (gate, up, down), with biases if the model has them."""
        h, i = self.hidden, self.intermediate
        return 3 * h * i + ((2 * i + h) if self.expert_bias else 0)

    def mlp_params(self) -> int:
        router = (self.hidden * self.n_experts + self.n_experts) if self.is_moe else 0
        return self.n_experts * self.expert_params() + router

    def layer_params(self) -> int:
        return self.attn_params() + self.mlp_params() + 2 * self.hidden  # + two RMSNorm weights

    @property
    def n_params(self) -> int:
        """Total parameters: layers, embedding, LM head (unless tied), final norm."""
        emb = self.vocab * self.hidden
        return self.layers * self.layer_params() + emb * (1 if self.tied_embeddings else 2) + self.hidden

    @property
    def n_active(self) -> int:
        """Parameters used per token, model-card convention (embedding table excluded): 3.6B for gpt-oss-20b."""
        per_layer = self.layer_params() - (self.n_experts - self.experts_per_tok) * self.expert_params()
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return self.layers * per_layer + head + self.hidden

    def largest_param(self) -> int:
        """Elements of the largest single parameter (what a ZeRO-3 load gathers whole at once): the
        embedding / LM head, a dense MLP matrix, or one layer's fused experts (gate_up: E x h x 2I)."""
        mlp = self.n_experts * self.hidden * 2 * self.intermediate if self.is_moe else self.hidden * self.intermediate
        return max(self.vocab * self.hidden, mlp)

    def expert_weight_params(self) -> int:
        """Parameters stored as MXFP4 in gpt-oss checkpoints: the expert projection matrices."""
        return self.layers * self.n_experts * 3 * self.hidden * self.intermediate if self.is_moe else 0


_HF = "HF config.json (values cross-checked in public copies found with the code search)"
MODELS: dict[str, ModelShape] = {
    s.name: s
    for s in [
        # 494,032,768 params; seed 002 printed 502,830,976 = 494,032,768 + 8,798,208 LoRA (r=16, all-linear)
        ModelShape("Qwen2.5-0.5B", 24, 896, 14, 2, 64, 151936, 4864, tied_embeddings=True, attn_bias="qkv",
                   source=f"Qwen/Qwen2.5-0.5B {_HF}; Qwen2.5-Coder-0.5B-Instruct has the same shape"),
        # 1,543,714,304 params
        ModelShape("Qwen2.5-1.5B", 28, 1536, 12, 2, 128, 151936, 8960, tied_embeddings=True, attn_bias="qkv",
                   source=f"Qwen/Qwen2.5-1.5B {_HF}"),
        # 20,914,757,184 total, 3.6B active; 32 experts, top-4; MXFP4 experts on disk
        ModelShape("gpt-oss-20b", 24, 2880, 64, 8, 64, 201088, 2880, n_experts=32, experts_per_tok=4,
                   attn_bias="qkvo", attn_sinks=True, expert_bias=True, attention="eager", attention_masks=2,
                   flex_attention=True, checkpoint="mxfp4", expert_gate="gpt-oss", source=f"openai/gpt-oss-20b {_HF}; totals match the model card (21B total, 3.6B active)"),
        # 116,829,156,672 total, 5.1B active; 128 experts, top-4
        ModelShape("gpt-oss-120b", 36, 2880, 64, 8, 64, 201088, 2880, n_experts=128, experts_per_tok=4,
                   attn_bias="qkvo", attn_sinks=True, expert_bias=True, attention="eager", attention_masks=2,
                   flex_attention=True, checkpoint="mxfp4", expert_gate="gpt-oss", source=f"openai/gpt-oss-120b {_HF}; totals match the model card (117B total, 5.1B active)"),
        # 134,515,008 params (the embedded default model)
        ModelShape("SmolLM2-135M", 30, 576, 9, 3, 64, 49152, 1536, tied_embeddings=True,
                   source=f"HuggingFaceTB/SmolLM2-135M {_HF}"),
    ]
}
MODELS["Qwen2.5-Coder-0.5B-Instruct"] = MODELS["Qwen2.5-0.5B"]  # seed 002's model: same architecture
MODELS["Qwen2.5-1.5B-Instruct"] = MODELS["Qwen2.5-1.5B"]  # seed 000's model: same architecture


def get_model(model: str | ModelShape) -> ModelShape:
    """A registered shape by name (case-insensitive), or the shape itself."""
    if isinstance(model, ModelShape):
        return model
    for name, shape in MODELS.items():
        if name.lower() == model.lower():
            return shape
    raise ValueError(f"unknown model '{model}'; known: {', '.join(MODELS)} (or pass a ModelShape)")


def gpu_capacity_gb(gpu: str | float) -> float:
    """GB of a named GPU (see GPUS) or a number of GB as given."""
    if isinstance(gpu, (int, float)):
        return float(gpu)
    if gpu not in GPUS:
        raise ValueError(f"unknown GPU '{gpu}'; known: {', '.join(GPUS)} (or pass a number of GB)")
    return GPUS[gpu]


def _bytes(dtype: str) -> float:
    if dtype not in BYTES:
        raise ValueError(f"unknown dtype '{dtype}'; valid: {', '.join(BYTES)}")
    return BYTES[dtype]


def _linear_dims(m: ModelShape) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each targetable linear in one layer (dense MLP names)."""
    h, hq, hkv, i = m.hidden, m.hq, m.hkv, m.intermediate
    return {"q_proj": (h, hq), "k_proj": (h, hkv), "v_proj": (h, hkv), "o_proj": (hq, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def lora_params(model: str | ModelShape, rank: int, targets=ATTENTION) -> int:
    """Trainable LoRA parameters: ``rank * (in + out)`` per targeted linear per layer.

    Qwen2.5-0.5B, rank 16, all-linear: 24 * 16 * (2*(896+896) + 2*(896+128) + 3*(896+4864)) = 8,798,208,
    seed 002's "trainable params: 8,798,208". MLP targets on an MoE model are refused (seed 003 §6:
    "Do NOT use all-linear with MoE models").
    """
    m = get_model(model)
    dims = _linear_dims(m)
    bad = [t for t in targets if t not in dims]
    if bad:
        raise ValueError(f"unknown LoRA target(s) {bad}; valid: {', '.join(dims)}")
    if m.is_moe and any(t not in ATTENTION for t in targets):
        raise ValueError(f"{m.name} is MoE: target attention only {ATTENTION} (seed 003 §6)")
    return m.layers * sum(rank * (dims[t][0] + dims[t][1]) for t in targets)


@dataclass
class MemoryEstimate:
    """A per-GPU memory breakdown: rows of (term, GB, note), the total, a verdict and the dominant term."""

    title: str
    capacity_gb: float
    rows: list[tuple[str, float, str]] = field(default_factory=list)  # terms that add up to the peak
    aside: list[tuple[str, float, str]] = field(default_factory=list)  # shown but not in the peak (CPU, other phase)
    assumptions: list[str] = field(default_factory=list)
    problem: str = ""  # set when the plan fails for a reason the total does not show (vLLM shortfall)

    @property
    def total_gb(self) -> float:
        return sum(gb for _, gb, _ in self.rows)

    @property
    def fraction(self) -> float:
        return self.total_gb / self.capacity_gb

    @property
    def verdict(self) -> str:
        """"OOM" (>= 100% of capacity), "tight" (>= 90%) or "fits"."""
        if self.problem or self.fraction >= 1.0:
            return "OOM"
        return "tight" if self.fraction >= TIGHT else "fits"

    @property
    def dominant(self) -> str:
        """The largest term of the peak."""
        return max(self.rows, key=lambda r: r[1])[0]

    def gb(self, term: str) -> float:
        """GB of a term by name (0 if absent)."""
        return sum(g for t, g, _ in self.rows if t == term)

    def table(self) -> str:
        w = max([len(t) for t, _, _ in self.rows + self.aside] + [24])
        lines = [self.title]
        lines += [f"  {t:<{w}} {g:>8.2f} GB  {n}" for t, g, n in self.rows]
        lines.append("  " + "-" * (w + 12))
        lines.append(f"  {'total (peak)':<{w}} {self.total_gb:>8.2f} GB  of {self.capacity_gb:.1f} GB "
                     f"= {self.fraction:.0%}")
        for t, g, n in self.aside:
            lines.append(f"  ({t}: {g:.2f} GB, not in the peak: {n})")
        lines.append(f"  verdict: {self.verdict} - dominant term: {self.dominant} "
                     f"({self.gb(self.dominant):.2f} GB, {self.gb(self.dominant) / self.total_gb:.0%} of the peak)")
        if self.problem:
            lines.append(f"  problem: {self.problem}")
        if self.assumptions:
            lines.append("  assumptions: " + "; ".join(self.assumptions))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _activation_bytes_per_token_layer(m: ModelShape, b: float, seq_len: int, attention: str,
                                      rb: float | None = None, nograd: bool = False) -> float:
    """Bytes autograd keeps per token per layer without checkpointing (see module doc); ``rb`` bytes per element
    of the residual stream (the norms' inputs and outputs), ``b`` unless the stream is float32 (masters).
    ``nograd``: a no-grad forward's layer instead, whose MoE block holds its own peak
    (:func:`_moe_nograd_bytes_per_token`) rather than what a backward would need."""
    h, hq, hkv, i = m.hidden, m.hq, m.hkv, m.intermediate
    rb = b if rb is None else rb
    attn = rb * 4 * h + b * (3 * hq + 3 * hkv) + 8 * h  # + fp32 RMSNorm upcasts (two norms)
    if m.is_moe and nograd:
        mlp = _moe_nograd_bytes_per_token(m, b)
    elif m.is_moe:
        mlp = b * (m.experts_per_tok * (2 * h + _gate_saved(m) * i) + m.n_experts)
    else:
        mlp = b * 4 * i
    if attention == "eager":
        attn += b * m.heads * (seq_len + (1 if m.attn_sinks else 0))  # softmax output saved for backward
    elif attention not in FUSED_ATTENTION:
        raise ValueError(f"attention must be 'eager' or one of {FUSED_ATTENTION}, got {attention!r}")
    return attn + mlp


def _gate_saved(m: ModelShape) -> int:
    """Widths of I that one routed (token, expert) pair keeps for backward (module doc): the gate/up output (2),
    the gate's own saved tensors, and the down projection's input (1). gpt-oss's gate (GptOssExperts._apply_gate:
    gate.clamp, up.clamp, gate * sigmoid(alpha gate), (up + 1) * glu) saves the clamped gate, the sigmoid, up + 1
    and glu: 7; SwiGLU's (act(gate) * up) saves act(gate): 4."""
    return 7 if m.expert_gate == "gpt-oss" else 4


def _moe_nograd_bytes_per_token(m: ModelShape, b: float) -> float:
    """The peak a no-grad MoE layer holds per token, inside transformers' grouped_mm experts forward
    (transformers.integrations.moe.grouped_mm_experts_forward, the default experts implementation), per routed
    pair: the token's copy h; the per-pair gathered gate/up bias 2I (gpt-oss: expert_bias) and the gate/up output
    2I, both alive while the gate runs; the gate's live temporaries: gpt-oss 5I (clamped gate and up, the
    sigmoid, glu, up + 1, their product, at most five at once), SwiGLU 2I (act(gate), the product). Measured on
    an H200: gpt-oss-20b's attention dims, 2 layers, T 4450, one row, peaked at 1.07 GiB where the earlier
    dense-SwiGLU term gave 0.83 (scripts/gpu_check.py gptoss_nograd); tests/test_models_moe_nograd_memory.py measures
    this term's live tensors on a CPU."""
    widths = (2 if m.expert_bias else 0) + 2 + (5 if m.expert_gate == "gpt-oss" else 2)
    return b * m.experts_per_tok * (m.hidden + widths * m.intermediate)


FUSED_ATTENTION = ("sdpa", "flex")  # kernels that compute the scores in tiles and never hold (heads, T, T)


def estimator_attention(implementation: str) -> str:
    """The estimator's name for a transformers ``attn_implementation``: "eager" (materialises the scores),
    "flex" (flex_attention), or "sdpa" (SDPA, flash-attention and hub kernels: tiled, like flex)."""
    return {"eager": "eager", "flex_attention": "flex"}.get(implementation, "sdpa")


def pick_attention(choice: str, *, default: str, flex: bool, device_type: str) -> str:
    """The ``attn_implementation`` a run uses (transformers' names). ``choice`` (RunConfig.attn_implementation)
    unless "auto". Auto: the model's default (``default``: "sdpa", or "eager" for a model with no SDPA path),
    except on CUDA for a model whose default is eager and that has a flex-attention path (``flex``: gpt-oss),
    which then runs flex_attention: eager's (heads, T, T) scores at seed 003's T ~ 5,000 are 3.3 GB per
    sequence per tensor, flex computes them in tiles. transformers' flex path cannot apply attention sinks on
    a CPU (it needs the log-sum-exp flex returns only on GPUs), so CPUs keep the default."""
    if choice != "auto":
        return choice
    if device_type == "cuda" and default == "eager" and flex:
        return "flex_attention"
    return default


def nograd_row_bytes(m: ModelShape, seq_len: int, b: float, attention: str, rb: float | None = None) -> float:
    """Bytes one sequence of ``seq_len`` tokens holds at the peak of a no-grad forward (the reference and
    old-logprob passes), besides the logits chunk: the residual stream in and out of the layer computed and
    that layer's intermediates, and with eager attention NOGRAD_SCORE_COPIES (heads, T, T + sink) score
    tensors (scores + mask, the sink concatenation, its max-shifted copy / softmax: nothing is kept for a
    backward, but those are alive at once in transformers' eager_attention_forward) plus the causal masks."""
    rb = b if rb is None else rb
    T = seq_len
    row = T * (2 * rb * m.hidden + _activation_bytes_per_token_layer(m, b, T, "sdpa", rb, nograd=True))
    if attention == "eager":
        row += T * (NOGRAD_SCORE_COPIES * m.heads * (T + (1 if m.attn_sinks else 0)) + m.attention_masks * T) * b
    return row


def nograd_rows(m: ModelShape, seq_len: int, b: float, attention: str, *, free_bytes: float, most: int,
                rb: float | None = None, fixed_bytes: float = 0.0) -> int:
    """Sequences per no-grad forward for auto ``logprob_batch_size``: ``most`` (max(micro_batch_size, 8)), fewer
    where eager attention's scores would not fit NOGRAD_BUDGET of the free memory (after ``fixed_bytes``, the
    logits chunk), at least 1. Other attention holds no scores: ``most``."""
    if attention != "eager":
        return most
    per_row = nograd_row_bytes(m, seq_len, b, attention, rb)
    return max(1, min(most, int((NOGRAD_BUDGET * free_bytes - fixed_bytes) // per_row)))


DS_REDUCE_BUCKET = 5e8  # DeepSpeed's default zero_optimization.reduce_bucket_size (runtime/zero/config.py)


def estimate_train_memory(
    model: str | ModelShape,
    *,
    gpu: str | float = "H100-80GB",  # a name in GPUS or GB
    train_dtype: str = "bf16",  # weights and activations on the GPU while training (mxfp4 checkpoints dequantise to it)
    finetune: str = "lora",  # "lora" | "full"
    lora_rank: int = 32,  # seed 003: 32 (20B), 64 (120B)
    lora_targets=ATTENTION,  # seed 003 §6: attention only
    lora_dropout: float = 0.0,
    lora_adapter_dtype: str | None = None,  # None: fp32 (peft) without ZeRO, train_dtype under DeepSpeed
    reference: str | None = None,  # "copy" | "adapter_disabled" | "none"; None: LoRA -> adapter_disabled, full -> copy
    optimizer_dtype: str = "fp32",  # AdamW m and v
    master_weights: bool | None = None,  # None: yes for full FT in half precision, no otherwise
    sequences: int = 1,  # N: sequences per forward/backward micro-batch
    seq_len: int = 1024,  # T: prompt + completion tokens
    gradient_checkpointing: bool = True,
    attention: str | None = None,  # "sdpa" (flash / memory-efficient) | "eager" (T x T scores); None: the model's
    logits: str = "full",  # "full" | "chunked"
    logits_copies: float = LOGITS_LEAN,  # fp32 (N, T, V) tensors alive at the peak (LOGITS_NAIVE = 6; module doc)
    logits_chunk: int = 1024,  # token rows per chunk when logits="chunked"
    generation: tuple[int, int] | None = None,  # (sequences, tokens) if HF generate shares this GPU
    zero_stage: int = 0,  # DeepSpeed ZeRO stage (0 = plain DDP / single GPU)
    world_size: int = 1,  # ranks the ZeRO partitions are spread over
    offload: bool = False,  # ZeRO-3 parameter offload to CPU (OpenRLHF --offload)
    adam_offload: bool = False,  # optimizer states (and fp32 master) to CPU (--adam_offload)
    vllm_gpu_memory_utilization: float | None = None,  # a vLLM engine colocated on this GPU
    overhead_gb: float = 0.5,  # CUDA context, cuBLAS/NCCL workspaces
    reduce_bucket: float = DS_REDUCE_BUCKET,  # ZeRO-3's reduce_bucket_size (elements): its gradient bucket
    nograd_sequences: int | None = None,  # rows per reference / old-logprob forward; None: no such pass; 0: auto
    nograd_most: int = 8,  # auto's ceiling: max(micro_batch_size, 8) (RunConfig.logprob_batch_size)
    title: str | None = None,
) -> MemoryEstimate:
    """Peak memory of one training GPU, term by term (formulas in the module docstring)."""
    m = get_model(model)
    cap = gpu_capacity_gb(gpu)
    b = _bytes(train_dtype)
    attention = attention or m.attention
    if train_dtype == "mxfp4":
        raise ValueError("train_dtype 'mxfp4': MXFP4 checkpoints are dequantised for training; use bf16")
    if finetune not in ("lora", "full"):
        raise ValueError(f"finetune must be 'lora' or 'full', got {finetune!r}")
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0..3, got {zero_stage}")
    if offload and zero_stage != 3:
        raise ValueError("offload (parameter offload) needs zero_stage=3")
    reference = reference or ("adapter_disabled" if finetune == "lora" else "copy")
    if reference not in ("copy", "adapter_disabled", "none"):
        raise ValueError(f"reference must be 'copy', 'adapter_disabled' or 'none', got {reference!r}")
    ws = max(1, world_size)
    shard_w = ws if zero_stage == 3 else 1  # weights (and a ZeRO-wrapped reference)
    shard_g = ws if zero_stage >= 2 else 1
    shard_o = ws if zero_stage >= 1 else 1
    P = m.n_params
    rows: list[tuple[str, float, str]] = []
    aside: list[tuple[str, float, str]] = []
    notes: list[str] = []

    def add(term, nbytes, note, on_cpu=False):
        (aside if on_cpu else rows).append((term, nbytes / GB, ("on CPU: " if on_cpu else "") + note))

    part = f" / {shard_w} ranks (ZeRO-3)" if shard_w > 1 else ""
    add("policy weights", P * b / shard_w, f"{P / 1e9:.2f}B params x {b:g} B ({train_dtype}){part}", on_cpu=offload)
    if reference == "copy":
        add("reference model (frozen copy)", P * b / shard_w, f"a second {P / 1e9:.2f}B x {b:g} B{part}",
            on_cpu=offload)
    else:
        notes.append("reference = " + ("policy with the LoRA adapter disabled (no copy)"
                                       if reference == "adapter_disabled" else "none (no KL term)"))

    if finetune == "lora":
        trainable = lora_params(m, lora_rank, lora_targets)
        ad = lora_adapter_dtype or ("fp32" if zero_stage == 0 else train_dtype)
        ab = _bytes(ad)
        add("LoRA adapter", trainable * ab / shard_w,
            f"rank {lora_rank} on {'/'.join(t.replace('_proj', '') for t in lora_targets)}: "
            f"{trainable / 1e6:.1f}M params x {ab:g} B ({ad})")
        grad_b, master = ab, False
    else:
        trainable, ad, ab = P, train_dtype, b
        grad_b = b
        master = (train_dtype != "fp32") if master_weights is None else master_weights
        if master and zero_stage == 0:
            grad_b = 4.0  # torch backends: the gradients are the float32 masters'

    ob = _bytes(optimizer_dtype)
    add("optimizer states (AdamW m+v)", trainable * 2 * ob / shard_o,
        f"{trainable / 1e6:,.1f}M trainable x 2 x {ob:g} B ({optimizer_dtype})"
        + (f" / {shard_o} ranks" if shard_o > 1 else ""), on_cpu=adam_offload)
    if master:
        add("fp32 master weights", trainable * 4 / shard_o, "mixed precision keeps an fp32 copy of trainable params",
            on_cpu=adam_offload)

    if zero_stage == 3:
        # DeepSpeed 0.19.8 runtime/zero/stage3.py: with contiguous_gradients (its default) the optimizer allocates
        # one flat gradient bucket of reduce_bucket_size elements per gradient dtype on the GPU, whatever the
        # model's size: 0.93 GiB in bf16 at the default 5e8 (the H200 check of 2026-11-27 measured a 1.0 GiB peak
        # for the tiny model's ZeRO-3 step that the estimate put at 0.48)
        add("ZeRO-3 gradient bucket", reduce_bucket * grad_b,
            f"reduce_bucket_size {reduce_bucket:.3g} elements x {grad_b:g} B (DeepSpeed's, allocated whole)")
    if zero_stage == 3 and (ws > 1 or offload):
        biggest = max(m.layer_params(), m.vocab * m.hidden)
        add("ZeRO-3 gathered layers", 2 * biggest * b,
            f"current + prefetched layer gathered whole ({biggest / 1e9:.2f}B params each)")

    # training phase
    train: list[tuple[str, float, str]] = []
    tokens = sequences * seq_len
    # the residual stream (each decoder layer's input: what checkpointing keeps) is in the embedding's dtype:
    # float32 where the torch backends' full fine-tuning made every trainable weight a float32 master (the
    # embedding too; autocast leaves lookups and residual adds alone, so bf16 + fp32 stays fp32 all the way)
    rb = 4.0 if master and zero_stage == 0 else b
    per_tl = _activation_bytes_per_token_layer(m, b, seq_len, attention, rb)
    if gradient_checkpointing:
        act = tokens * (m.layers * rb * m.hidden + 2 * per_tl)
        act_note = (f"checkpointing: {m.layers} layer inputs ({'fp32 residual stream' if rb == 4 else f'{rb:g} B'})"
                    f" + 1 layer recomputed with grads, {tokens:,} tokens ({sequences} x {seq_len})")
    else:
        act = tokens * m.layers * per_tl
        act_note = (f"{per_tl / 1e3:.0f} KB/token/layer x {m.layers} layers x {tokens:,} tokens "
                    f"({sequences} x {seq_len}), no checkpointing")
    train.append(("activations", act, act_note + (", eager attention (saved T^2 softmax)" if attention == "eager" else "")))
    if attention == "eager":
        eager = sequences * seq_len * (2 * m.heads * seq_len + m.attention_masks * seq_len) * b
        train.append(("eager attention scores", eager,
                      f"the computed layer's (heads={m.heads}, T, T) scores x 2 + {m.attention_masks} causal mask(s) "
                      f"(N={sequences}, T={seq_len})"))
    if finetune == "lora" and ab != b:
        dims = _linear_dims(m)
        per_tok = sum(dims[t][0] for t in lora_targets) * ab * (2 if lora_dropout > 0 else 1)
        n_layers = 1 if gradient_checkpointing else m.layers
        train.append(("LoRA input casts", tokens * n_layers * per_tok,
                      f"peft casts each targeted input to {ad} and saves it"
                      + (" (+ dropout output)" if lora_dropout > 0 else "")))
    if logits == "full":
        rows_l, ln = tokens, f"(N={sequences}, T={seq_len}, V={m.vocab:,}) fp32"
    elif logits == "chunked":
        rows_l, ln = min(tokens, logits_chunk), f"chunks of {logits_chunk} token rows x V={m.vocab:,} fp32"
    else:
        raise ValueError(f"logits must be 'full' or 'chunked', got {logits!r}")
    train.append(("logits", rows_l * m.vocab * 4 * logits_copies, f"{ln} x {logits_copies:g} copies"))
    train.append(("gradients", trainable * grad_b / shard_g,
                  f"{trainable / 1e6:,.1f}M trainable x {grad_b:g} B" + (f" / {shard_g} ranks" if shard_g > 1 else "")))

    gen: list[tuple[str, float, str]] = []
    if generation is not None:
        gseq, gtok = generation
        kv = 2 * m.layers * m.kv_heads * m.head_dim * b * gtok * gseq
        gen.append(("generation KV cache", kv, f"2 x {m.layers} layers x {m.kv_heads} kv heads x {m.head_dim} x "
                                               f"{b:g} B x {gtok} tokens x {gseq} sequences"))
        gen.append(("generation logits", gseq * m.vocab * 4, "one decoding step, fp32"))
    fixed = [("CUDA context + workspaces", overhead_gb, "fixed allowance")]
    if vllm_gpu_memory_utilization:
        fixed.insert(0, ("vLLM reservation (colocated)", vllm_gpu_memory_utilization * cap,
                         f"gpu_memory_utilization {vllm_gpu_memory_utilization} x {cap:.1f} GB"))

    # the reference and old-logprob passes: no-grad forwards of their own width (logprob_batch_size rows), a
    # phase of their own before the update (no gradients allocated yet). With eager attention their scores
    # dominate: auto sizes the rows to what fits beside the static terms, as the trainer does from free memory
    nograd: list[tuple[str, float, str]] = []
    if nograd_sequences is not None:
        def logits_rows(k: int) -> int:  # fp32 logits + log-softmax: one chunk's, nothing kept for backward
            return min(k * seq_len, logits_chunk) if logits == "chunked" else k * seq_len

        k, how = nograd_sequences, f"logprob_batch_size {nograd_sequences}"
        if not k:
            free = (cap - sum(g for _, g, _ in rows) - sum(g for _, g, _ in fixed)) * GB
            k = nograd_rows(m, seq_len, b, attention, free_bytes=free, most=nograd_most, rb=rb,
                            fixed_bytes=logits_rows(nograd_most) * m.vocab * 8)
            how = (f"auto: {k} of at most {nograd_most}" + (f", the rows whose scores fit {NOGRAD_BUDGET:.0%} of "
                                                           f"the {free / GB:.1f} GB beside the static terms"
                                                           if attention == "eager" else ""))
        logits_ng = logits_rows(k) * m.vocab * 8
        per_row_act = nograd_row_bytes(m, seq_len, b, "sdpa", rb)
        nograd.append(("no-grad forward activations", k * per_row_act,
                       f"reference / old-logprob pass, {k} x {seq_len} tokens ({how}): one layer at a time"))
        if attention == "eager":
            nograd.append(("no-grad eager attention scores", nograd_row_bytes(m, seq_len, b, "eager", rb) * k
                           - per_row_act * k,
                           f"{NOGRAD_SCORE_COPIES} (heads={m.heads}, T, T) score tensors + {m.attention_masks} causal "
                           f"mask(s) at once, N={k} rows ({how}), T={seq_len}"))
        nograd.append(("no-grad logits", logits_ng, f"{logits_rows(k)} token rows x V={m.vocab:,} fp32 logits + "
                                                    "log-softmax"))
    phases = sorted([(sum(x[1] for x in ph), i, ph) for i, ph in enumerate((train, nograd, gen)) if ph],
                    key=lambda t: (-t[0], t[1]))
    rows += [(t, n / GB, d) for t, n, d in phases[0][2]]
    aside += [(t, n / GB, "other phase: " + d) for _, _, ph in phases[1:] for t, n, d in ph]
    rows += fixed

    notes.append(f"{finetune} fine-tuning, {train_dtype} weights, {optimizer_dtype} AdamW states"
                 + (", fp32 master weights" if master else ""))
    if zero_stage:
        notes.append(f"ZeRO-{zero_stage} over {ws} ranks" + (", params offloaded" if offload else "")
                     + (", optimizer offloaded" if adam_offload else ""))
    head = title or f"{m.name} training on {gpu if isinstance(gpu, str) else f'{cap:g} GB GPU'}"
    return MemoryEstimate(head, cap, rows, aside, notes)


def estimate_rollout_memory(
    model: str | ModelShape,
    *,
    gpu: str | float = "H100-80GB",
    gpu_memory_utilization: float = 0.85,  # seed 003: --vllm_gpu_memory_utilization 0.85
    tensor_parallel: int = 2,  # seed 003: 2 engines x TP=2
    weight_dtype: str = "mxfp4",  # seed 003: vLLM runs gpt-oss in native MXFP4
    kv_dtype: str = "bf16",
    max_model_len: int | None = None,  # tokens per sequence, to say how many sequences the KV pool holds
    activation_gb: float = 2.0,  # vLLM's profiled forward workspace + CUDA graphs, a rough allowance
    title: str | None = None,
) -> MemoryEstimate:
    """A vLLM rollout GPU: vLLM reserves ``gpu_memory_utilization * capacity`` and fills what its
    weights shard and workspace leave with KV cache. Fails (OOM) only if the weights and workspace
    do not fit in the reservation; the verdict on the GPU is the reservation's share of capacity.
    """
    m = get_model(model)
    cap = gpu_capacity_gb(gpu)
    if weight_dtype == "mxfp4":
        q = m.expert_weight_params()
        wbytes = q * BYTES["mxfp4"] + (m.n_params - q) * BYTES["bf16"]  # experts in MXFP4, the rest bf16
        wnote = f"{q / 1e9:.1f}B expert params x 4.25 bits + {(m.n_params - q) / 1e9:.1f}B x 2 B"
    else:
        wbytes = m.n_params * _bytes(weight_dtype)
        wnote = f"{m.n_params / 1e9:.2f}B x {_bytes(weight_dtype):g} B"
    reserved = gpu_memory_utilization * cap
    w = wbytes / tensor_parallel / GB
    kv_pool = reserved - w - activation_gb
    rows = [(f"weights ({weight_dtype}) / TP={tensor_parallel}", w, wnote),
            ("forward workspace (allowance)", activation_gb, "profiled activations, CUDA graphs, sampler")]
    kv_per_token = 2 * m.layers * m.kv_heads * m.head_dim * _bytes(kv_dtype) / tensor_parallel
    kv_tokens = max(kv_pool, 0.0) * GB / kv_per_token
    kv_note = f"the rest of the reservation: {kv_tokens / 1e6:.2f}M tokens"
    if max_model_len:
        kv_note += f" = {kv_tokens / max_model_len:.0f} sequences of {max_model_len}"
    rows.append(("KV cache pool", max(kv_pool, 0.0), kv_note))
    est = MemoryEstimate(
        title or f"{m.name} vLLM rollout on {gpu if isinstance(gpu, str) else f'{cap:g} GB GPU'}", cap, rows, [],
        [f"vLLM reserves gpu_memory_utilization {gpu_memory_utilization} x {cap:.1f} GB = {reserved:.1f} GB "
         f"= {reserved * GB / 2**30:.1f} GiB as nvidia-smi shows it"])
    if kv_pool <= 0:
        est.problem = (f"weights + workspace ({w + activation_gb:.1f} GB) exceed vLLM's reservation "
                       f"({reserved:.1f} GB): raise gpu_memory_utilization or tensor_parallel")
    return est


def estimate_load_memory(
    model: str | ModelShape,
    *,
    gpu: str | float = "H100-80GB",
    train_dtype: str = "bf16",  # the dtype the weights load into (an MXFP4 checkpoint is dequantised to it)
    world_size: int = 1,  # trainer ranks
    ranks_per_node: int | None = None,  # trainer ranks on one node (None: all of them)
    zero_stage: int = 0,
    partitioned: bool | None = None,  # None: rftlib's rule, partitioned exactly under ZeRO-3
    offload: bool = False,  # ZeRO-3 parameter offload: partitions in host RAM
    adam_offload: bool = False,  # DeepSpeed CPU Adam: fp32 m, v, master of the trainable partition in host RAM
    trainable: int = 0,  # trainable parameters (LoRA: lora_params(...); full fine-tuning: n_params)
    host_ram_gb: float = 2048.0,  # one node's RAM (a DGX H100: 2 TB)
    host_baseline_gb: float = 3.0,  # per process: Python + torch + CUDA context + NCCL buffers (allowance)
    overhead_gb: float = 0.5,  # CUDA context, as estimate_train_memory
    title: str | None = None,
) -> tuple[MemoryEstimate, MemoryEstimate]:
    """(one rank's GPU while the model loads, host RAM of one node), term by term (module docstring)."""
    m = get_model(model)
    b = _bytes(train_dtype)
    ws = max(1, world_size)
    per_node = min(ws, ranks_per_node or ws)
    partitioned = (zero_stage == 3) if partitioned is None else partitioned
    if partitioned and zero_stage != 3:
        raise ValueError("a partitioned load is ZeRO-3's (zero_stage=3)")
    if offload and not partitioned:
        raise ValueError("offload (parameter offload) needs zero_stage=3")
    P, big = m.n_params, m.largest_param()
    mx = m.checkpoint == "mxfp4"
    deq = (big if not m.is_moe else m.n_experts * m.hidden * 2 * m.intermediate) * (2.5 + 2.5 * b) if mx else 0.0
    head = title or f"{m.name} load ({'partitioned, ZeRO-3' if partitioned else 'whole model per rank'}, {ws} rank(s))"
    cap = gpu_capacity_gb(gpu)
    g = MemoryEstimate(f"{head}: one rank's GPU while loading", cap)
    h = MemoryEstimate(f"{head}: host RAM of one node ({per_node} rank(s))", host_ram_gb)
    if partitioned:
        part = P * b / ws
        where = "host RAM (offload)" if offload else "GPU"
        g.rows.append(("weights partition", 0.0 if offload else part / GB,
                       f"{P / 1e9:.2f}B x {b:g} B / {ws} ranks, in {where}"))
        g.rows.append(("one parameter gathered", big * b / GB,
                       f"the largest ({big / 1e6:,.0f}M params) whole on every rank while rank 0 fills it"))
        if offload:
            h.rows.append(("offloaded weight partitions", per_node * part / GB, f"{per_node} x {part / GB:.1f} GB"))
        if mx:
            h.rows.append(("MXFP4 dequantisation (rank 0)", deq / GB, "one fused expert tensor: n x (2.5 + 2.5 b) B"))
        g.aside.append(("whole-model load instead", P * b / GB,
                        "each rank's GPU if it loaded the whole model before DeepSpeed partitioned it (rftlib before "
                        "issue 22, seed 003 without its actor patch)"))
        g.assumptions.append("rftlib.models.loading.load_partitioned: zero.Init, rank 0 fills one tensor at a time")
    else:
        g.rows.append(("whole model", P * b / GB, f"{P / 1e9:.2f}B x {b:g} B moved to the GPU"
                                                  + (" before DeepSpeed partitions it" if zero_stage else "")))
        h.rows.append(("whole model per rank", per_node * P * b / GB,
                       f"{per_node} x {P * b / GB:.1f} GB (the checkpoint{' dequantised' if mx else ''} in host RAM)"))
        if mx:
            h.rows.append(("MXFP4 dequantisation (every rank)", per_node * deq / GB,
                           f"{per_node} x one fused expert tensor: n x (2.5 + 2.5 b) B"))
    g.rows.append(("CUDA context + workspaces", overhead_gb, "fixed allowance"))
    if adam_offload and trainable:
        h.rows.append(("CPU Adam (m, v, fp32 master)", per_node * trainable * 12 / ws / GB,
                       f"{trainable / 1e6:,.1f}M trainable x 12 B / {ws} ranks x {per_node}"))
    h.rows.append(("process baseline", per_node * host_baseline_gb,
                   f"{per_node} x {host_baseline_gb:g} GB allowance (Python, torch, CUDA context, NCCL)"))
    if mx:
        h.assumptions.append(f"checkpoint MXFP4 ({m.expert_weight_params() / 1e9:.1f}B expert params at 4.25 bits), "
                             f"dequantised to {train_dtype}")
    return g, h


def shape_from_hf_config(c, name: str = "loaded") -> ModelShape:
    """The ModelShape of a loaded model's HF config (``model.config``): what the trainer's estimate uses."""
    heads = c.num_attention_heads
    q = getattr(c, "quantization_config", None)
    method = q.get("quant_method") if isinstance(q, dict) else getattr(q, "quant_method", None)
    gpt_oss = c.model_type == "gpt_oss"  # sinks per head, biased experts
    return ModelShape(name, c.num_hidden_layers, c.hidden_size, heads, getattr(c, "num_key_value_heads", heads) or heads,
                      getattr(c, "head_dim", None) or c.hidden_size // heads, c.vocab_size, c.intermediate_size,
                      tied_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
                      n_experts=getattr(c, "num_local_experts", 1) or 1,
                      experts_per_tok=getattr(c, "num_experts_per_tok", 1) or 1,
                      attn_bias="qkvo" if getattr(c, "attention_bias", False) else ("qkv" if c.model_type == "qwen2"
                                                                                  else "none"),
                      attn_sinks=gpt_oss, expert_bias=gpt_oss, expert_gate="gpt-oss" if gpt_oss else "swiglu",
                      attention=estimator_attention(getattr(c, "_attn_implementation", None) or "sdpa"),
                      flex_attention=gpt_oss,
                      attention_masks=len(set(getattr(c, "layer_types", None) or ["full"])),
                      checkpoint="mxfp4" if str(getattr(method, "value", method)) == "mxfp4" else "bf16")


def train_dtype_of(dtype: str) -> str:
    """The estimator's dtype name for a model's (resolved) ``dtype`` (ModelSettings.dtype)."""
    return {"bfloat16": "bf16", "float16": "fp16"}.get(dtype, "fp32")


def config_attention(attn_implementation: str, shape: str | ModelShape, device_type: str = "cuda") -> str:
    """The estimator's attention for a run on ``device_type`` (a preflight plans for GPUs):
    :func:`pick_attention` of ``attn_implementation`` (ModelSettings) over the model's default, as the loader
    resolves it (rftlib.models.loading.load_policy)."""
    m = get_model(shape)
    return estimator_attention(pick_attention(attn_implementation, default=m.attention,
                                              flex=m.flex_attention, device_type=device_type))


def estimate_for_config(model: ModelSettings, rollout: RolloutSettings, optim: OptimizationSettings,
                        shape: str | ModelShape, *, needs_reference: bool, on_policy: bool, gpu: str | float,
                        world_size: int, seq_len: int, chunk_rows: int, sharding, hf_generate: bool,
                        attention: str | None = None, engine_share: float = 0.0) -> MemoryEstimate:
    """estimate_train_memory for a run's settings (its model, rollout and optimization sections), one trainer GPU
    of ``world_size`` ranks.

    What depends on the backend and the engine comes from their declarations, passed in by the caller (this
    layer knows neither registry): ``sharding`` (rftlib.backends.sharding_of: ZeRO stage, CPU offload)
    and ``hf_generate`` (the engine generates on the trainer's module: EngineKind.on_trainer_module).
    ``attention``: the estimator's name for what runs (a loaded model's), else :func:`config_attention`.
    ``needs_reference`` and ``on_policy`` (RunConfig's derived values, computed there once) say which no-grad
    passes run. ``engine_share``: the fraction of this GPU an engine beside the trainer reserves up front
    (EngineKind.trainer_gpu_share: a colocated vLLM's gpu_memory_utilization), a row of its own; 0: none.

    The no-grad passes are counted where the trainer runs them (rftlib.train.loop: the reference logprobs when
    beta > 0, the old logprobs when the update is off-policy: several optimizer steps per rollout, or an engine
    that is not the trainer's module), at ``logprob_batch_size`` rows (0: auto, up to max(micro_batch_size, 8))."""
    nograd = needs_reference or not on_policy
    return estimate_train_memory(
        shape, gpu=gpu, train_dtype=train_dtype_of(model.dtype), finetune="lora" if model.lora_rank else "full",
        lora_rank=max(model.lora_rank, 1), lora_targets=tuple(t for t in model.lora_target_modules
                                                 if t in (ATTENTION if get_model(shape).is_moe else ALL_LINEAR)) or ATTENTION, sequences=optim.micro_batch_size, seq_len=seq_len,
        gradient_checkpointing=model.gradient_checkpointing, logits="chunked", logits_chunk=chunk_rows,
        generation=(max(1, rollout.rollout_batch_size * rollout.n_samples_per_prompt // world_size), seq_len) if hf_generate
        else None,
        zero_stage=sharding.zero_stage, world_size=world_size, offload=sharding.offload_params,
        adam_offload=sharding.offload_optimizer, attention=attention or config_attention(model.attn_implementation, shape),
        nograd_sequences=(optim.logprob_batch_size or 0) if nograd else None,
        nograd_most=max(optim.micro_batch_size, 8), vllm_gpu_memory_utilization=engine_share or None)
