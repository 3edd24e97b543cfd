"""Adapter versions in server engines (issue 32 item 2): a generate call samples the adapter it was submitted
with while a sync publishes the next one; at max_staleness k > 0 a superseded adapter stays loaded (and its
sync directory on disk) while anything holds it, and goes at its last release; at k = 0 the requests are
today's (the previous adapter unloaded at the load). vLLM itself is not needed: the HTTP layer
(``_Server.post``) is faked and records every request, so this runs anywhere. The real engine's side (an
in-flight request keeps its adapter through an unload) is tests/test_rollout_vllm_sync.py's."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import rftlib.rollout.vllm as vb
import rftlib.rollout.vllm_server as vs
from rftlib.models.tiny import build_tiny_tokenizer
from rftlib.rollout.vllm import VLLMSettings

TOK = build_tiny_tokenizer()
TOKEN = TOK("a", add_special_tokens=False).input_ids[0]  # every fake completion is this one token (no stop)
WAIT_S = 30.0  # the longest any test waits on another thread (a hang fails instead of blocking the suite)


def settings(k: int, lora_rank: int = 16, urls=("http://fake-engine:1/v1",)) -> VLLMSettings:
    return VLLMSettings(model_dir="stub", dtype="float32", lora_rank=lora_rank, max_model_len=512, kv_cache_gib=0.25,
                        gpu_memory_utilization=0.0, enforce_eager=True, tensor_parallel_size=1, num_engines=len(urls),
                        sleep_mode=False, probe_tol=0.05, seed=0, on_gpu=False, urls=tuple(urls), max_staleness=k)


def version_of(model: str) -> int:
    """The logprob a fake completion reports: minus the adapter's sync number (base: 0), so a rollout says
    which adapter sampled it."""
    return 0 if model == "base" else int(model.rsplit("-", 1)[1])


class FakeEngines:
    """Stands in for ``_Server.post``: records (engine, route, adapter name) in order; a completions request
    whose gate is set waits on it (after saying so on ``arrived``)."""

    def __init__(self):
        self.log: list[tuple[int, str, str]] = []
        self.lock = threading.Lock()
        self.gate: threading.Event | None = None
        self.arrived = threading.Event()
        self.refuse_once: set[str] = set()  # names whose first load answers 400 "already been loaded"

    def post(self, srv, route, body, what):
        name = body.get("lora_name") or body.get("model")
        with self.lock:
            self.log.append((srv.k, route, name))
        if route == "/v1/load_lora_adapter" and name in self.refuse_once:
            self.refuse_once.discard(name)
            raise vs.EngineRefusedError(f"vLLM engine {srv.k} refused {route} while {what}: HTTP 400 "
                                        f"{{\"message\": \"The lora adapter '{name}' has already been loaded.\"}}",
                                        400)
        if route != "/v1/completions":
            return {"text": "Success"}
        if self.gate is not None:
            self.arrived.set()
            assert self.gate.wait(WAIT_S), "the test never opened the gate"
        n = body["n"]
        return {"choices": [{"index": p * n + j, "token_ids": [TOKEN],
                             "logprobs": {"token_logprobs": [-float(version_of(body["model"]))]}}
                            for p in range(len(body["prompt"])) for j in range(n)]}

    def routes(self, route: str) -> list[str]:
        return [name for _, r, name in self.log if r == route]

    def adapter_requests(self) -> list[tuple[str, str]]:
        """(load|unload, name) in order, over every engine."""
        return [(r.split("/")[-1].split("_")[0], name) for _, r, name in self.log if "lora_adapter" in r]


class FakePeft:
    """What sync_weights needs of the policy: save_pretrained writes an adapter directory."""

    def save_pretrained(self, path, **kw):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "adapter_model.safetensors").write_bytes(b"x" * 8)


@pytest.fixture
def engine_factory(tmp_path, monkeypatch):
    fake = FakeEngines()
    monkeypatch.setattr(vs, "import_vllm", lambda *a: None)
    monkeypatch.setattr(vs._Server, "wait_healthy", lambda self, timeout: None)
    monkeypatch.setattr(vs._Server, "post", lambda srv, route, body, what: fake.post(srv, route, body, what))
    # the probe's own correctness is tests/test_rollout_vllm_sync.py's; here a sync is its loads and unloads
    monkeypatch.setattr(vb, "check_sync", lambda *a, **k: {"max_diff": 0.0, "threshold": 1.0, "noise": 0.0})
    made = []

    def make(k: int, **kw):
        eng = vs.VLLMServerEngine(settings(k, **kw), TOK, tmp_path / "run")
        made.append(eng)
        return eng, fake

    yield make
    for eng in made:
        eng.close()


def sync_dirs(eng) -> list[str]:
    return sorted(p.name for p in eng.sync_root.glob("sync_*"))


def gen(eng, adapter=None):
    return eng.generate(["1 + 1", "2 + 2"], group_size=2, max_new_tokens=1, temperature=1.0, seed=7, adapter=adapter)


@pytest.mark.parametrize("adapter", ["policy-1", None], ids=["named", "newest-at-submission"])
def test_a_call_samples_its_adapter_while_a_sync_publishes_the_next(engine_factory, adapter):
    """Two prompts, sent one after the other (a one-thread pool: requests queued behind others, as a long batch's
    are): the first request blocks in the engine while the main thread syncs policy-2. Every request of the
    call still names policy-1 (captured at submission, not read when each request runs), and the rollout's
    logprobs are policy-1's (-1). The call held policy-1, so the sync did not unload it; the call's return
    released it, and only then was it unloaded and its directory deleted."""
    eng, fake = engine_factory(1)
    model = FakePeft()
    eng.sync_weights(model)  # policy-1
    eng.pool = ThreadPoolExecutor(max_workers=1)  # requests run one after another
    fake.gate = threading.Event()
    out = {}
    t = threading.Thread(target=lambda: out.update(ro=gen(eng, adapter)))
    t.start()
    assert fake.arrived.wait(WAIT_S)
    eng.sync_weights(model)  # policy-2, published while the call is in flight
    assert eng.adapter == "policy-2" and eng.inflight == {"policy-1": 1}
    assert fake.adapter_requests() == [("load", "policy-1"), ("load", "policy-2")]  # policy-1 kept: in flight
    assert sync_dirs(eng) == ["sync_000001", "sync_000002"]
    fake.gate.set()
    t.join(WAIT_S)
    assert fake.routes("/v1/completions") == ["policy-1", "policy-1"]
    assert out["ro"].behaviour_logprobs[:, 0].tolist() == [-1.0] * 4
    assert fake.adapter_requests() == [("load", "policy-1"), ("load", "policy-2"), ("unload", "policy-1")]
    assert sync_dirs(eng) == ["sync_000002"] and eng.inflight == {}
    fake.gate = None
    gen(eng)  # a new call samples the newest
    assert fake.routes("/v1/completions")[-2:] == ["policy-2", "policy-2"]


def test_k1_keeps_a_held_adapter_and_its_directory_until_released(engine_factory):
    """max_staleness 1: a producer holds policy-1 (a batch in flight) and the pipeline holds policy-2 (the newest
    published) while policy-3 syncs: three adapters and their three directories are live, and KEEP_SYNC_DIRS = 2
    would have deleted sync_000001 under the batch in flight (vLLM reloads an evicted adapter from that path).
    Versions nothing holds go at the sync that supersedes them. The release unloads policy-1 and deletes its
    directory; a later hold of it is refused with the reason."""
    eng, fake = engine_factory(1)
    model = FakePeft()
    eng.sync_weights(model)
    eng.hold("policy-1")
    eng.sync_weights(model)  # policy-2
    eng.hold("policy-2")
    eng.sync_weights(model)  # policy-3
    assert sync_dirs(eng) == ["sync_000001", "sync_000002", "sync_000003"]
    eng.release("policy-2")
    eng.sync_weights(model)  # policy-4
    assert fake.adapter_requests() == [("load", "policy-1"), ("load", "policy-2"), ("load", "policy-3"),
                                       ("unload", "policy-2"), ("load", "policy-4"), ("unload", "policy-3")]
    assert sync_dirs(eng) == ["sync_000001", "sync_000004"]
    gen(eng, "policy-1")  # still servable: a second call on the held version
    assert fake.routes("/v1/completions") == ["policy-1", "policy-1"]
    eng.release("policy-1")
    assert fake.adapter_requests()[-1] == ("unload", "policy-1")
    assert sync_dirs(eng) == ["sync_000004"] and eng.inflight == {}
    with pytest.raises(ValueError, match="adapter 'policy-1' is not loaded in this engine"):
        gen(eng, "policy-1")
    with pytest.raises(ValueError, match="without a matching hold"):
        eng.release("policy-4")
    # retire: a name superseded while held goes at its last release; the newest cannot be retired
    eng.hold("policy-4")
    eng.sync_weights(model)  # policy-5
    eng.retire("policy-4")  # already retiring: still held, so nothing yet
    assert ("unload", "policy-4") not in fake.adapter_requests()
    eng.release("policy-4")
    assert fake.adapter_requests()[-1] == ("unload", "policy-4") and sync_dirs(eng) == ["sync_000005"]
    with pytest.raises(ValueError, match="newest"):
        eng.retire("policy-5")


def test_k0_requests_are_todays(engine_factory):
    """max_staleness 0: each sync loads the new adapter on every engine, then unloads the previous one on every
    engine (today's order), completions ask for the newest adapter, two sync directories stay on disk, and a
    hold does not keep an adapter (nothing is in flight during a synchronous sync)."""
    eng, fake = engine_factory(0, urls=("http://fake-engine:1/v1", "http://fake-engine:2/v1"))
    model = FakePeft()
    eng.sync_weights(model)
    gen(eng)
    eng.hold("policy-1")
    eng.sync_weights(model)
    gen(eng)
    eng.sync_weights(model)
    want = [(0, "/v1/load_lora_adapter", "policy-1"), (1, "/v1/load_lora_adapter", "policy-1"),
            (0, "/v1/completions", "policy-1"), (1, "/v1/completions", "policy-1"),
            (0, "/v1/load_lora_adapter", "policy-2"), (1, "/v1/load_lora_adapter", "policy-2"),
            (0, "/v1/unload_lora_adapter", "policy-1"), (1, "/v1/unload_lora_adapter", "policy-1"),
            (0, "/v1/completions", "policy-2"), (1, "/v1/completions", "policy-2"),
            (0, "/v1/load_lora_adapter", "policy-3"), (1, "/v1/load_lora_adapter", "policy-3"),
            (0, "/v1/unload_lora_adapter", "policy-2"), (1, "/v1/unload_lora_adapter", "policy-2")]
    assert sorted(fake.log[2:4]) == want[2:4] and sorted(fake.log[8:10]) == want[8:10]  # concurrent requests
    assert fake.log[:2] + fake.log[4:8] + fake.log[10:] == want[:2] + want[4:8] + want[10:]
    assert sync_dirs(eng) == ["sync_000002", "sync_000003"]
    eng.release("policy-1")  # the hold is undone without a second unload
    assert len(fake.log) == len(want)


def test_a_name_an_earlier_trainer_left_loaded_is_replaced(engine_factory):
    """Engines reached by vllm_urls outlive a trainer: a resumed (or new) trainer counts syncs from 1 again, and
    vLLM answers 400 to a second load of a name the earlier trainer left loaded. The engine unloads that stale
    name and loads again (a fresh LoRA id in vLLM, so the new weights), instead of failing the sync."""
    eng, fake = engine_factory(0)
    fake.refuse_once = {"policy-1"}
    eng.sync_weights(FakePeft())
    assert fake.adapter_requests() == [("load", "policy-1"), ("unload", "policy-1"), ("load", "policy-1")]
    assert eng.adapter == "policy-1"


def test_server_command_max_loras():
    """--max-loras 1 (and no --max-cpu-loras) when synchronous, as before issue 32; k+1 and k+2 at k > 0 (one
    slot fewer would make vLLM's scheduler hold version v+1's requests until v's finish). Full weights: no
    LoRA flags. The flag names are vllm 0.32's (engine/arg_utils.py: --max-loras, --max-cpu-loras)."""
    # a CPU engine's scheduler flags last (rftlib.rollout.vllm.cpu_scheduler_args: no chunked prefill, a token
    # budget of at least one context and 4,096)
    cpu = ["--kv-cache-memory-bytes", "268435456", "--no-enable-chunked-prefill", "--max-num-batched-tokens", "4096"]
    tail = ["--enable-lora", "--max-lora-rank", "16", "--max-loras", "1", *cpu]
    cmd0 = vs.server_command(settings(0), 0, 8000)
    assert cmd0[-len(tail):] == tail and "--max-cpu-loras" not in cmd0
    cmd1 = vs.server_command(settings(1), 0, 8000)
    assert cmd1 == cmd0[:-len(tail)] + ["--enable-lora", "--max-lora-rank", "16", "--max-loras", "2",
                                        "--max-cpu-loras", "3", *cpu]
    assert " --max-loras 4 --max-cpu-loras 5 " in " ".join(vs.server_command(settings(3), 0, 8000)) + " "
    full = " ".join(vs.server_command(settings(2, lora_rank=0), 0, 8000))
    assert "--max-loras" not in full and "--max-cpu-loras" not in full


def test_launch_plan_engines_get_the_max_loras_of_max_staleness():
    """rft launch --dry-run prints the engines the trainer relies on: --max-loras 2 --max-cpu-loras 3 at k = 1."""
    from rftlib.config import make_config
    from rftlib.launch.plan import make_plan

    cfg = make_config("seed003-gpt-oss-20b-a28b", {"max_staleness": 1})
    engines = [p for p in make_plan(cfg, "r", gpus_per_node=8).processes if p.role == "vllm"]
    assert engines and all(" --max-loras 2 --max-cpu-loras 3" in " ".join(p.cmd) for p in engines)
    cfg0 = make_config("seed003-gpt-oss-20b-a28b")
    engines0 = [p for p in make_plan(cfg0, "r", gpus_per_node=8).processes if p.role == "vllm"]
    assert all(" --max-loras 1 " in " ".join(p.cmd) and "--max-cpu-loras" not in p.cmd for p in engines0)


def test_each_sync_reads_the_noise_of_the_recent_syncs(engine_factory, monkeypatch):
    """The engine keeps its syncs' noise measurements and hands check_sync the recent ones (rftlib.rollout.sync_probe.
    noise_level: why). An engine that measured 0.173 once, then 0.05, and went stale at its 12th sync (gap 0.3, 6x
    its noise) is refused there: the threshold of the 11th was 4 x 0.05 (0.173 is the largest of 11, passed over).
    The running maximum kept before judged every later sync against 4 x 0.173 = 0.69 and accepted it."""
    from rftlib.rollout import SyncProbeError, sync_probe

    eng, fake = engine_factory(0)
    monkeypatch.setattr(vb, "check_sync", sync_probe.check_sync)  # the real probe on made-up measurements
    measured = iter([(0.1, 0.173)] + [(0.1, 0.05)] * 10 + [(0.3, 0.05)])  # (gap, noise) per sync
    monkeypatch.setattr(sync_probe, "probe_gaps",
                        lambda engine, model, amp, noise: dict(zip(("max_diff", "noise"), next(measured))))
    model = FakePeft()
    for _ in range(11):
        out = eng.sync_weights(model)
    assert out["probe_threshold"] == pytest.approx(4 * 0.05) and list(eng.probe_noises) == [0.173] + [0.05] * 10
    with pytest.raises(SyncProbeError, match=r"differ by 0.3 > 0.2 "):
        eng.sync_weights(model)
