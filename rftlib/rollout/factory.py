"""Pick the rollout engine a RunConfig asks for: ``make_engine(cfg, model, tok, run_dir)``.

hf: HF generate on the trainer's own module (shares_trainer_module=True: sync is a no-op, the
behaviour logprobs are the trainer's, no old-logprob pass, no TIS). vllm: a vLLM engine placed by
``vllm_placement`` (colocate: in-process; server: N ``vllm serve`` processes), synced once here so it
starts from exactly the trainer's weights (an init_adapter or a resumed checkpoint included).
"""

from __future__ import annotations



def make_engine(cfg, model, tok, run_dir, *, sync: bool = True):
    """The engine for cfg.rollout_engine; with ``sync`` a vLLM engine has had one sync (its result in
    .initial_sync). The trainer passes sync=False and syncs itself once its state is final (a resume
    restores the adapter after the engine starts; several ranks share a server engine's load)."""
    if cfg.rollout_engine == "hf":
        from rftlib.models.loading import compute_dtype
        from rftlib.rollout.hf import HFEngine

        return HFEngine(model, tok, amp=compute_dtype(cfg.dtype, cfg.autocast))
    if cfg.rollout_engine != "vllm":
        raise ValueError(f"rollout_engine='{cfg.rollout_engine}': choose hf or vllm")
    from rftlib.rollout.vllm import VLLMEngine, VLLMSettings

    settings = VLLMSettings.from_config(cfg, model, run_dir)
    if cfg.vllm_placement == "colocate":
        engine = VLLMEngine(settings, tok, run_dir)
    elif cfg.vllm_placement == "server":
        from rftlib.rollout.vllm_server import VLLMServerEngine

        engine = VLLMServerEngine(settings, tok, run_dir)
    else:
        raise ValueError(f"vllm_placement='{cfg.vllm_placement}': choose colocate or server")
    if sync:
        try:
            engine.initial_sync = engine.sync_weights(model, verify=True)
        except BaseException:
            engine.close()
            raise
    return engine
