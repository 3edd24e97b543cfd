"""Methods rftlib adds to vLLM's workers (``worker_extension_cls``), callable by name through
``collective_rpc`` both in-process (colocate) and over a server's ``/collective_rpc`` (which accepts
method names and string arguments only, not callables).

Imported by vLLM inside its worker, so it must import nothing heavy from rftlib.
"""

from __future__ import annotations

import base64

from safetensors.torch import load


class RftlibWorkerExtension:
    """Mixed into vLLM's Worker: ``self`` is the worker."""

    def rftlib_reload_weights(self, weights_iterator=None, weights_path: str | None = None) -> bool:
        """Reload every weight in place (from tensors, or from a saved HF dir), then repack a tied lm_head.

        Returns whether a tied lm_head was repacked.
        """
        self.model_runner.reload_weights(weights_iterator=weights_iterator, weights_path=weights_path)
        return refresh_tied_lm_head(self.model_runner.get_model())


    def rftlib_stage_weights(self, payload: str) -> int:
        """Hold one chunk of full weights sent in memory (base64 of a safetensors blob, the trainer's
        rftlib.rollout.vllm_server.weight_chunks) until :meth:`rftlib_commit_weights`; returns the tensors held."""
        staged = self.__dict__.setdefault("_rftlib_staged", {})
        staged.update(load(base64.b64decode(payload)))
        return len(staged)

    def rftlib_commit_weights(self) -> bool:
        """Reload every staged tensor in place (one reload_weights over the whole set, then the tied lm_head
        repack) and drop them; returns whether a tied lm_head was repacked."""
        staged = self.__dict__.pop("_rftlib_staged", None)
        if not staged:
            raise RuntimeError("rftlib_commit_weights: no weights were staged (rftlib_stage_weights first)")
        return self.rftlib_reload_weights(weights_iterator=iter(staged.items()))


def refresh_tied_lm_head(model) -> bool:
    """Rebuild a tied lm_head's CPU GEMM from the reloaded weights.

    vLLM's CPU build packs every linear weight into a oneDNN / sgl-kernel handle once, after loading
    (``dispatch_cpu_unquantized_gemm``). ``reload_weights`` refreshes the embedding's tensor, but the
    tied lm_head (the same module, used as a GEMM) keeps computing logits from the handle packed from
    the *old* weights: measured here, the sync probe saw a 2.0 log-prob gap on the tiny model.
    Re-running the head's ``process_weights_after_loading`` re-packs it. GPUs keep no packed copy.
    """
    from vllm.platforms import current_platform  # inside vLLM's worker, which must not load rftlib.rollout.vllm

    head = getattr(model, "lm_head", None)
    if head is None or not current_platform.is_cpu() or not getattr(model.config, "tie_word_embeddings", False):
        return False
    head.quant_method.process_weights_after_loading(head)
    return True
