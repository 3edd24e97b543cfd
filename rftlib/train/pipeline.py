"""Where each step's scored batch comes from: the rollout source (``max_staleness``, issue 32).

Seed 003 trains gpt-oss on 4 GPUs while 4 serve two vLLM engines. A synchronous step (generate -> score ->
update -> sync -> generate) leaves the engines idle during the update and the trainer idle during generation.
With ``max_staleness: k > 0`` a producer thread generates and scores the next batches while the trainer
updates, and no batch is trained whose weights lag the trainer's by more than k versions.

Versions: version v is the number of updates applied (the trainer's ``step_num`` after the update); the
engines start at v = 0. Step n (metrics row ``"step": n``) starts from version n-1, trains on a batch sampled
by version v_b and publishes version n; its staleness is (n-1) - v_b.

The bound holds by construction (admission control, as AReaL's ``StalenessManager``): batch j is *permitted*
(its prompts drawn, its seed drawn) only in ``take(j-k)``, when the trainer is at version j-1-k, and the
producer binds the newest published version when it starts the batch, so v_b >= j-1-k and the staleness
at step j is at most k. Nothing is dropped; ``take`` still checks the bound and raises on a violation (a bug).

- :class:`InlineSource` (k = 0): the rollout runs on the trainer's thread exactly where the synchronous step
  ran it: the same calls in the same order, so the metrics rows are today's bit for bit (tested).
- :class:`ThreadedSource` (k > 0): the producer thread. Prompts and seeds are drawn on the main thread at the
  permit (the sampler's cursor and the engine's seed stream stay in one deterministic order); the producer
  only generates (the engine, the tokenizer) and scores (the training reward): it never touches the trainer's
  module, optimizer or a collective. Permitted batches not yet trained are the checkpoint's ``pending``: a
  resume regenerates them first (rftlib.train.checkpoint), so no prompt is skipped or trained twice. A resume
  under another bound (k = 3 saved, k = 1 now) keeps their prompts but permits each only when the new bound
  allows (``take(j-k)``), so the bound holds from the first resumed step; at k = 0 they are generated in turn on
  the trainer's thread.
- LoRA versions: each published adapter is *held* by the source until a newer one is published, and each
  batch holds the adapter it was bound to until it is scored, so an engine that keeps several adapters
  (rftlib.rollout.vllm: ``hold`` / ``release``) unloads a version only once nothing in flight uses it.
"""

from __future__ import annotations

import json
import os
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

# how often a waiting trainer wakes to check that the producer is alive (seconds)
WAIT_POLL_S = 5.0


@dataclass
class Permit:
    """One batch the producer may generate: the step that will train on it, the pool indices of the whole
    (global) batch in the sampler's order (each rank generates its own slice; every rank permits the same), and
    this rank's engine base seed (drawn on the main thread; None: the engine draws its own)."""

    batch: int
    indices: list[int]
    seed: int | None = None

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the batch and its global indices (the same on every rank; a resume draws
        fresh seeds, since the batch is regenerated from the resumed weights anyway)."""
        return {"batch": self.batch, "indices": list(self.indices)}


class InlineSource:
    """max_staleness 0: the rollout runs on the trainer's thread when the step asks for it (today's step).

    ``produce(n_prompts)`` is the trainer's synchronous rollout (draw the prompts, generate, score);
    ``produce_indices(indices)`` generates and scores given pool indices (a checkpoint's pending batches, whose
    prompts an asynchronous attempt drew before it was resumed synchronously)."""

    max_staleness = 0
    threaded = False

    def __init__(self, produce: Callable[[int], Any], produce_indices: Callable[[list[int]], Any] | None = None):
        self.produce, self.produce_indices = produce, produce_indices
        self.reserved: dict[int, list[int]] = {}  # batch -> pool indices a checkpoint drew and did not train

    def take(self, n: int, n_prompts: int, last: int | None = None):
        """Batch ``n``'s scored groups, generated now; the seconds spent waiting for it (none: it is the rollout)."""
        if n in self.reserved:
            return self.produce_indices(self.reserved.pop(n)), 0.0
        return self.produce(n_prompts), 0.0

    def publish(self, version: int, adapter: str | None) -> None:
        """A new version is in the engines (nothing to do: the next rollout samples it)."""

    def pending(self) -> list[dict[str, Any]]:
        return [{"batch": b, "indices": list(ix)} for b, ix in sorted(self.reserved.items())]

    def load_pending(self, pending: list[dict[str, Any]]) -> None:
        """Batches an asynchronous attempt permitted and did not train: their prompts (the sampler's cursor is past
        them) are trained first, each generated when its step runs, so none is skipped or trained twice."""
        if pending and self.produce_indices is None:
            raise ValueError(f"the checkpoint holds {len(pending)} batch(es) permitted but not trained, and this "
                             "source has no way to generate given prompts (produce_indices)")
        self.reserved = {int(p["batch"]): [int(i) for i in p["indices"]] for p in pending}

    def close(self) -> None:
        pass


class ProducerError(RuntimeError):
    """The producer thread failed; its traceback is in the message and the original is the cause."""


class ThreadedSource:
    """max_staleness k > 0: a producer thread generates and scores batches ahead of the trainer.

    draw(n_prompts) -> the global batch's pool indices (main thread: the sampler); next_seed() -> the engine's base
    seed for a batch, or None (main thread); produce(indices, seed, adapter, version, batch) -> a scored batch
    (producer thread); engine: held adapters are ``hold``/``release``-d on it when it has them. ``record``:
    called on the producer thread with timeline intervals (lane, phase, t0, t1, fields).
    """

    threaded = True

    def __init__(self, k: int, *, draw: Callable[[int], list[int]], next_seed: Callable[[], int | None],
                 produce: Callable[..., Any], engine: Any, version: int, adapter: str | None,
                 record: Callable[..., None] | None = None):
        if k < 1:
            raise ValueError(f"ThreadedSource needs max_staleness >= 1, got {k} (0 is InlineSource)")
        self.max_staleness = k
        self._draw, self._next_seed, self._produce, self.engine = draw, next_seed, produce, engine
        self._record = record
        self.cond = threading.Condition()
        self.queue: deque[Permit] = deque()  # permitted, not started
        self.permits: dict[int, Permit] = {}  # permitted, not yet taken by the trainer (the checkpoint's pending)
        self.reserved: dict[int, list[int]] = {}  # batch -> pool indices a checkpoint drew, not yet permitted again
        self.done: dict[int, Any] = {}  # batch -> scored, waiting for its step
        self.next_batch: int | None = None  # the next batch number to permit
        self.latest: tuple[int, str | None] = (version, adapter)  # the newest published (version, adapter)
        self._hold(adapter)
        self.error: BaseException | None = None
        self.error_text = ""
        self.stopping = False
        self.busy: int | None = None  # the batch being generated, since busy_since
        self.busy_since = 0.0
        self.thread = threading.Thread(target=self._run, name="rft-rollout-producer", daemon=True)
        self.thread.start()

    # ---- adapters the engine must keep -----------------------------------------------------------------
    def _hold(self, adapter: str | None) -> None:
        if adapter is not None and hasattr(self.engine, "hold"):
            self.engine.hold(adapter)

    def _release(self, adapter: str | None) -> None:
        if adapter is not None and hasattr(self.engine, "release"):
            self.engine.release(adapter)

    # ---- the trainer's side (main thread) --------------------------------------------------------------
    def load_pending(self, pending: list[dict[str, Any]]) -> None:
        """Batches a checkpoint permitted and did not train: their prompts (drawn before the checkpoint: the
        sampler's cursor is past them) are reserved and regenerated first, in order, before any new prompt is
        drawn. Each is permitted again only when this source's bound allows (``take``), not all at once: a
        checkpoint of max_staleness 3 holds three batches, and a resume at max_staleness 1 generating them together
        from the resumed version would train the third 2 versions behind."""
        with self.cond:
            self.reserved = {int(p["batch"]): [int(i) for i in p["indices"]] for p in pending}
            if pending:
                self.next_batch = min(self.reserved)

    def _permit(self, batch: int, n_prompts: int) -> None:
        indices = self.reserved.pop(batch) if batch in self.reserved else self._draw(n_prompts)
        permit = Permit(batch, indices, self._next_seed())
        with self.cond:
            self.permits[batch] = permit
            self.queue.append(permit)
            self.cond.notify_all()

    def take(self, n: int, n_prompts: int, last: int | None = None):
        """Batch ``n``'s scored groups (blocks until the producer has them) and the seconds the trainer waited.
        First permits every batch up to n+k that has none (so batch n+k may start once the trainer is at n-1),
        but none after ``last`` (the attempt's last step: nothing is generated that no step would train)."""
        if self.next_batch is None:
            self.next_batch = n
        while self.next_batch <= min(n + self.max_staleness, n if last is None else max(n, last)):
            if self.next_batch not in self.permits:
                self._permit(self.next_batch, n_prompts)
            self.next_batch += 1
        t = time.time()
        with self.cond:
            while n not in self.done:
                if self.error is not None:
                    raise ProducerError(f"the rollout producer failed while generating a batch:\n{self.error_text}") \
                        from self.error
                if not self.thread.is_alive():
                    raise ProducerError("the rollout producer thread is gone without an error (stopped?)")
                if n not in self.permits:
                    raise RuntimeError(f"batch {n} was never permitted (permits: {sorted(self.permits)}): a pipeline bug")
                self.cond.wait(WAIT_POLL_S)
            scored = self.done.pop(n)
            self.permits.pop(n, None)
        lag = (n - 1) - scored.version
        if lag > self.max_staleness:
            raise RuntimeError(f"staleness {lag} > max_staleness {self.max_staleness} at step {n}: batch {n} was "
                               f"generated by version {scored.version}; this is a pipeline bug")
        return scored, time.time() - t

    def publish(self, version: int, adapter: str | None) -> None:
        """Version ``version`` is in the engines under ``adapter``: batches started from now on sample it.
        The source holds the newest adapter and releases the one before (unloaded once nothing in flight uses it)."""
        self._hold(adapter)
        with self.cond:
            _, old = self.latest
            self.latest = (version, adapter)
        self._release(old)

    def pending(self) -> list[dict[str, Any]]:
        """Every batch whose prompts were drawn and the trainer has not taken (generating, generated, waiting, or
        reserved from a checkpoint and not permitted yet), for a checkpoint."""
        with self.cond:
            out = {b: self.permits[b].state() for b in self.permits}
            out.update({b: {"batch": b, "indices": list(ix)} for b, ix in self.reserved.items()})
            return [out[b] for b in sorted(out)]

    def close(self, timeout: float = 60.0) -> None:
        """Stop the producer: no new batch starts; the one generating is abandoned (it is in ``pending``)."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout)
        with self.cond:
            _, adapter = self.latest
            self.latest = (self.latest[0], None)
        self._release(adapter)

    # ---- the producer thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        """The producer's loop. Everything it does that can fail (the hold, the generate and scoring, the release of
        the adapter) is inside one ``try``: an error anywhere is recorded for the trainer, which raises it at its
        next ``take``, instead of a thread that ends with its traceback on stderr and a trainer told nothing."""
        try:
            while self._produce_next():
                pass
        except BaseException as e:  # noqa: BLE001 -- relayed to the trainer, which raises it
            with self.cond:
                self.error, self.error_text = e, traceback.format_exc()
                self.busy = None
                self.cond.notify_all()

    def _produce_next(self) -> bool:
        """Generate and score the next permitted batch (waiting for one); False once the source is stopping."""
        with self.cond:
            while not self.queue and not self.stopping:
                self.cond.wait()
            if self.stopping:
                return False
            permit = self.queue.popleft()
            version, adapter = self.latest
            self._hold(adapter)  # under the lock: a publish cannot release it between the read and the hold
            self.busy, self.busy_since = permit.batch, time.time()
        try:
            scored = self._produce(permit.indices, seed=permit.seed, adapter=adapter, version=version,
                                   batch=permit.batch)
        finally:
            self._release(adapter)  # an error of the produce above still propagates after the release
        with self.cond:
            self.busy = None
            if not self.stopping:
                self.done[permit.batch] = scored
            self.cond.notify_all()
        return True


def engine_seed(engine) -> int | None:
    """The engine's base seed for a batch, drawn on the trainer's thread when the batch is permitted (the draw
    ``rftlib.rollout.vllm`` makes inside generate), so a threaded producer keeps the engine's seed stream in the
    step order; None for an engine that draws none."""
    rng = getattr(engine, "rng", None)
    return None if rng is None else rng.randrange(2**40)


def hold_for_other_ranks(engine, dist, threaded: bool, held: set[str]) -> set[str]:
    """The adapters rank 0 holds loaded on the other ranks' behalf after this step; ``held``: those it held before.

    Server engines shared by several ranks at max_staleness > 0: rank 0 alone loads and unloads adapters, and its
    own holds (ThreadedSource._hold) are its own producer's, while another rank's producer may still sample an older
    version. Before the ranks publish the new version, each reports the adapters it holds (its newest, and any in
    flight); rank 0 holds those on the others' behalf and lets one go once no later report names it. A report made
    before the publish includes every version another rank can still bind, so none is unloaded under it. A
    collective when it applies (every rank calls it at the same point of the step); ``held`` back unchanged when it
    does not (one rank, k = 0, an engine not shared) and on the other ranks."""
    if not (threaded and dist.distributed and getattr(engine, "shared_across_ranks", False)
            and hasattr(engine, "inflight")):
        return held
    parts = dist.gather_objects(sorted(n for n, c in engine.inflight.items() if c > 0))
    if not dist.is_main:
        return held
    others = {n for p in parts[1:] for n in p}
    for name in sorted(others - held):
        engine.hold(name)
    for name in sorted(held - others):
        engine.release(name)
    return others


def make_source(k: int, **kw) -> InlineSource | ThreadedSource:
    """InlineSource at k = 0 (``produce_inline`` and ``produce_indices`` given), ThreadedSource otherwise
    (ThreadedSource's arguments)."""
    if k == 0:
        return InlineSource(kw["produce_inline"], kw.get("produce_indices"))
    kw.pop("produce_inline", None)
    kw.pop("produce_indices", None)
    return ThreadedSource(k, **kw)


def staleness_metrics(versions: list[int], step: int, k: int) -> dict[str, float]:
    """The row's staleness figures for step ``step`` (it started from version step-1) over the rows' versions
    (one per trained row, every rank's): mean, max, the oldest version and the histogram of lags 0..k."""
    if not versions:
        return {}
    lags = [(step - 1) - v for v in versions]
    out = {"staleness/mean": sum(lags) / len(lags), "staleness/max": float(max(lags)),
           "staleness/version_min": float(min(versions))}
    for d in range(k + 1):
        out[f"staleness/frac_lag{d}"] = sum(1 for x in lags if x == d) / len(lags)
    return out


def pipeline_text(k: int, *, engine: str, placement: str | None, lora: bool, tis_cap: float, tis_level: str) -> str:
    """What ``rft launch --dry-run`` prints about the pipeline it will run."""
    if k == 0:
        return ("pipeline: max_staleness 0 (synchronous): generate -> score -> update -> sync, one after the other; "
                "set max_staleness 1 to generate the next batch while the trainer updates")
    lines = [f"pipeline: max_staleness {k} (bounded-staleness asynchronous GRPO; 0 = synchronous)",
             f"  each rank: a producer thread generates and scores {'batch n+1' if k == 1 else f'batches n+1..n+{k}'} "
             f"on the {engine} engine(s) ({placement or 'its placement'}) while the trainer updates on batch n; the "
             f"batch trained at step n was sampled by version n-{k + 1} or later (the trainer's is n-1)"]
    if lora:
        lines.append(f"  versions: a LoRA adapter per version; engines keep up to {k + 1} loaded (--max-loras {k + 1}); "
                     "an old version is unloaded once no batch in flight uses it")
    else:
        lines.append(f"  versions: full weights (lora_rank 0): no sync waits for a batch in flight; the {engine} engine "
                     "declares it keeps the version each batch started with (vLLM cannot: it refuses max_staleness > 0 "
                     "without LoRA)")
    lines.append(f"  estimator: PPO ratio against the trainer's pre-update logprobs (the proximal policy); "
                 f"behaviour IS weight min(pi_prox / pi_engine, tis_cap={tis_cap:g}) at {tis_level} level")
    return "\n".join(lines)


TRAINED_BATCHES = "trained_batches.jsonl"  # under <run_dir>/logs: one line per step, what it trained


def log_trained(run_dir, step: int, indices: list[int], versions: list[int]) -> None:
    """Append the step's trained batch (its pool indices in the global order, the versions that sampled it) to
    ``logs/trained_batches.jsonl``: the record that no prompt is trained twice or skipped across a resume."""
    path = Path(run_dir) / "logs" / TRAINED_BATCHES
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps({"step": step, "indices": [int(i) for i in indices],
                            "versions": sorted({int(v) for v in versions})}) + "\n")


def read_trained(run_dir) -> list[dict[str, Any]]:
    """``logs/trained_batches.jsonl`` as a list of rows ([] when absent)."""
    path = Path(run_dir) / "logs" / TRAINED_BATCHES
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def truncate_trained(run_dir, step: int) -> None:
    """Drop the lines of steps after ``step`` (written after the checkpoint a resume starts from), atomically."""
    path = Path(run_dir) / "logs" / TRAINED_BATCHES
    rows = read_trained(run_dir)
    kept = [r for r in rows if r["step"] <= step]
    if len(kept) != len(rows):
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        os.replace(tmp, path)
