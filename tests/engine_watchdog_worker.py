"""Subprocess worker of tests/test_rollout_engine_watchdog.py: a trainer process that starts its server engines as
the trainer does (rftlib.rollout.vllm_server.VLLMServerEngine: each engine's Popen in a session of its own, its
/health wait, and whatever it starts beside it), with :data:`STAND_IN` for ``vllm serve``, then sleeps until it is
killed. It writes ``pids.json`` (the engines' pids) once every engine answered /health.

usage: engine_watchdog_worker.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import rftlib.rollout.vllm_server as vs
from rftlib.models.tiny import build_tiny_tokenizer
from rftlib.rollout.vllm import VLLMSettings

# ``vllm serve`` in miniature: it starts a child of its own (vLLM's API server starts its engine core) and answers
# /health on its port. argv: PORT MARKER (every process of it carries MARKER in its command line)
STAND_IN = """
import http.server, subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", sys.argv[2]])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def stand_in(marker: str):
    """A replacement for vllm_server.server_command: the stand-in on engine k's port."""
    return lambda s, k, port, python=sys.executable: [python, "-c", STAND_IN, str(port), f"{marker}-engine{k}"]


def settings(num_engines: int) -> VLLMSettings:
    return VLLMSettings(model_dir="stub", dtype="float32", lora_rank=16, max_model_len=512, kv_cache_gib=0.25,
                        gpu_memory_utilization=0.0, enforce_eager=True, tensor_parallel_size=1,
                        num_engines=num_engines, sleep_mode=False, probe_tol=0.05, seed=0, on_gpu=False)


def start_engines(out: Path, marker: str, num_engines: int = 2) -> vs.VLLMServerEngine:
    vs.import_vllm = lambda *a: None  # no vLLM needed: the processes are stand-ins
    vs.server_command = stand_in(marker)
    return vs.VLLMServerEngine(settings(num_engines), build_tiny_tokenizer(), out)


def main() -> None:
    out = Path(sys.argv[1])
    eng = start_engines(out, marker=str(out))
    (out / "pids.json").write_text(json.dumps([srv.proc.pid for srv in eng.servers]))
    time.sleep(600)


if __name__ == "__main__":
    main()
