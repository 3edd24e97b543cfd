"""The policy: loading (HF dirs, GGUF, the embedded SmolLM2, the tiny test model), LoRA, dtype,
the KL reference (the adapter disabled, never a second copy), and the policy forward.

    loading   load_model_and_tokenizer, apply_lora, Reference, compute_dtype, policy_parts
    forward   completion_logprobs and PolicyForward: per-token logprobs / entropy of completions
              through the backbone and the chunked LM head (the one module a backend wraps)
    tiny      the tiny locally built model the tests train
"""
