"""TrainerState: what a Trainer carries from one step to the next beside its modules, in one object.

The weights, the optimizer and the LR schedule live in the backend; the sampler keeps its own cursor; the engine
keeps its adapters. What is left is the run's own bookkeeping, which a checkpoint saves and a resume restores
(rftlib.train.checkpoint), a record and a replay read (rftlib.train.record, rftlib.train.replay), and the loop
advances (rftlib.train.loop): these fields, read and written here rather than as loose attributes of the Trainer
(the checkpoint used to write the Trainer's private ``_pending``). The Trainer keeps ``step_num``,
``eval_history`` and ``skipped_steps`` as properties over this object for the notebooks and callers that read them.

torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrainerState:
    """A run's bookkeeping between steps (the module docstring says who reads and writes it)."""

    step: int = 0
    """optimizer steps done (one a rollout at one update per rollout): the version the engine's weights have"""
    eval_history: list[dict[str, Any]] = field(default_factory=list)
    """every held-out eval's metrics row, in order (early stopping and the summary read it)"""
    skipped_steps: int = 0
    """updates skipped for a non-finite loss or gradient norm"""
    pending: list[dict[str, Any]] = field(default_factory=list)
    """max_staleness > 0: batches a checkpoint had permitted (their prompts drawn) but not trained; a resume
    generates them first, from the resumed weights (rftlib.train.pipeline), so none is skipped or trained twice"""

    held_for_others: set[str] = field(default_factory=set)
    """rank 0 of server engines shared by the ranks at max_staleness > 0: the adapters it holds loaded because
    another rank's producer may still sample them (rftlib.train.pipeline.hold_for_other_ranks). Not saved: a
    resume syncs the engines afresh and the other ranks report again before the first publish"""

    def saved(self) -> dict[str, Any]:
        """The fields as ``trainer_state.json`` holds them (``pending`` goes under ``pipeline``)."""
        return {"step": self.step, "eval_history": self.eval_history, "skipped_steps": self.skipped_steps}

    @classmethod
    def from_saved(cls, ts: dict[str, Any]) -> "TrainerState":
        """The state a ``trainer_state.json`` holds (older checkpoints: no skipped_steps, no pipeline)."""
        return cls(step=int(ts["step"]), eval_history=list(ts["eval_history"]),
                   skipped_steps=int(ts.get("skipped_steps", 0)),
                   pending=list(ts.get("pipeline", {}).get("pending", [])))
