"""Per-token logprobs of a rollout's completions under the current (or reference) policy.

Runs the backbone once over prompt+completion, keeps only the hidden states that predict
completion tokens, and hands them to the chunked LM-head computation in rftlib.algo.logprobs,
so the full (N, T, V) float32 logits never exist. Position ids are derived from the attention
mask exactly as ``generate`` derives them under left padding, so at ratio 1 the result equals
the behaviour logprobs.

``PolicyForward`` is that computation as ONE ``nn.Module``: the module a parallel wrapper (torch
DDP, a DeepSpeed engine) wraps. Everything the loss needs -- backbone, LM head -- runs inside its
``forward``, and the LM head is *called* as a module on each chunk rather than read as a weight,
so DDP's reducer sees the forward and ZeRO-3 gathers the partitioned head where it is used.
"""

from __future__ import annotations

import torch

from rftlib.algo.logprobs import chunked_logprobs_entropy
from rftlib.models.flex import flex_forward_kwargs
from rftlib.models.loading import policy_parts


def completion_logprobs(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                        completion_mask: torch.Tensor, *, temperature: float = 1.0, chunk_size: int = 1024,
                        with_entropy: bool = True, entropy_grad: bool = False,
                        checkpoint_chunks: bool | str = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs (n, T), entropy (n, T) or None) for n rows; zero where completion_mask is 0."""
    parts = policy_parts(model)
    P = prompt_ids.shape[1]
    input_ids = torch.cat([prompt_ids, completion_ids], 1)  # (n, P+T)
    attn = torch.cat([prompt_mask, completion_mask], 1).long()  # (n, P+T)
    # padding after EOS is masked too, but it only follows the real tokens, so causality keeps it harmless
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)  # (n, P+T)
    hidden = parts.backbone(input_ids=input_ids, attention_mask=attn, position_ids=position_ids, use_cache=False,
                            **flex_forward_kwargs(parts.backbone.config, input_ids.device)
                            ).last_hidden_state  # (n, P+T, H)
    hidden = hidden[:, P - 1:-1]  # (n, T, H): position t predicts completion token t
    logp, ent = chunked_logprobs_entropy(hidden, None, completion_ids, head=parts.lm_head, temperature=temperature,
                                         chunk_size=chunk_size, with_entropy=with_entropy, entropy_grad=entropy_grad,
                                         checkpoint_chunks=checkpoint_chunks)
    logp = logp * completion_mask  # (n, T)
    if ent is not None:
        ent = ent * completion_mask
    return logp, ent


class PolicyForward(torch.nn.Module):
    """The policy's (logprobs, entropy) forward as one module, for DDP / DeepSpeed to wrap.

    ``model`` is the (peft-wrapped) causal LM; its parameters are this module's parameters, so the
    optimizer, the gradient hooks and the ZeRO partitioning all see the same tensors.
    """

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                completion_mask: torch.Tensor, temperature: float = 1.0, chunk_size: int = 1024,
                with_entropy: bool = True, entropy_grad: bool = False, checkpoint_chunks: bool | str = True):
        return completion_logprobs(self.model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                                   temperature=temperature, chunk_size=chunk_size, with_entropy=with_entropy,
                                   entropy_grad=entropy_grad, checkpoint_chunks=checkpoint_chunks)
