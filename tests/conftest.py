import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _one_thread_per_xdist_worker() -> None:
    """Under pytest-xdist (make test-parallel and test-fast run ``-n 2``), each worker's torch/OpenMP pool is one
    thread, set before anything imports torch (its tests, their ranks, engines, papermill kernels and sandboxes
    inherit it). Two pools that each think they own the 2 cores spin against each other and run 5-10x slower;
    two pools of one thread do not. No core affinity: a worker's multi-process test (2 ranks, 2 engines, a
    detached launch) keeps both cores to spread over, and rftlib sizes each rank's pool from the cores it sees
    (``train.dist.cpu_threads_per_rank``: 2 cores // 2 ranks = 1 thread a rank)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):  # "gw0", "gw1", ... (unset without xdist)
        os.environ["OMP_NUM_THREADS"] = "1"


_one_thread_per_xdist_worker()

# Modules whose tests compare floats computed by CPU kernels (gradients, logprobs, losses through the
# model, engine vs trainer): marked `numeric`, which scripts/test_forced_isa.sh runs with other kernels.
# Test files are named test_<package>_<topic>.py after the rftlib package they test. Prefixes, so a new
# test_algo_*.py or test_rollout_vllm_*.py is in without a list to update; of train/ the modules that
# compare floats through the model (its checkpoint, device and build tests do not).
NUMERIC_MODULES = ("test_algo_", "test_rollout_hf", "test_rollout_vllm_", "test_eval_precision", "test_train_loop",
                   "test_train_guardrails", "test_train_precision", "test_train_speed",
                   "test_train_variants", "test_train_distributed", "test_train_logprob_batch",
                   "test_train_zero3_gather")


# The budget, printed at the end of every run (issue 41): CI has 90 minutes for set-up, the suite and the
# forced-ISA pass, so every change to the suite's cost shows in CI's log as the total time of each test file
# (setup + call + teardown of its tests, summed; under xdist the workers' reports reach the controller, so the
# sums are worker-seconds, not wall time). pytest's own --durations lists the slowest tests (make test: 25).
_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    if not _FILE_SECONDS:
        return
    rows = sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])
    total = sum(s for _, s in rows)
    terminalreporter.write_sep("=", f"seconds per test file ({len(rows)} files, {total:.0f} s in all)")
    for path, s in rows:
        terminalreporter.write_line(f"{s:8.1f} s  {100 * s / total:5.1f}%  {path}")


# The longest files first, for the phase that runs on both cores (make test's first; worker-seconds measured on
# aa9df2f + this change, 2-core AMD EPYC: report_presets 160, validate_criteria 110, notebooks_reports 79, cli_advice
# 67, notebooks 58, bench_grpo_step 58, launch_where 50, sft 43, train_replay 36, ...). xdist hands out whole files
# in this order (--dist loadfile --no-loadscope-reorder: a module's fixtures are built once, on one worker), so no
# worker starts a long file while the other has nothing left. Files not listed keep collection order after them.
# (Solo files first too, for make test-parallel: the longest of them would otherwise start last.)
LONGEST_FIRST = ("test_report_presets.py", "test_validate_criteria.py", "test_smoke.py", "test_attempts_lock.py",
                 "test_notebooks_reports.py",
                 "test_cli_advice.py", "test_notebooks.py", "test_bench_grpo_step.py", "test_launch_where.py",
                 "test_bench_tool_step.py",
                 "test_sft.py", "test_train_replay.py", "test_notebooks_ui.py", "test_launch_plan.py",
                 "test_notebooks_replay.py",
                 "test_launch_rehearsal.py", "test_train_distributed.py", "test_launch_detached.py",
                 "test_train_replay_distributed.py", "test_train_pipeline.py")

# Files whose tests start processes that want both cores: trainer ranks (torchrun, DeepSpeed), vLLM engines,
# detached launches, the GPU check's stages. Marked `solo`: make test runs them one at a time on one worker while the
# other worker runs the rest (--solo-worker above). Two of them side by side put 4-6 busy processes on 2 cores; a
# solo test beside a one-thread test does not. (test_smoke and test_attempts_lock left this list in issue 41: their
# processes take turns -- the smoke's lines one after another, a lock holder beside a trainer, two ranks refused at
# start -- so they run on the other worker, beside a solo test, and the solo worker's line is 2 minutes shorter.)
# In the order the solo worker runs them: those whose assertions are on numbers and polls with deadlines first (the
# rehearsal, the rank comparisons), sharing the cores with the one-thread files; those whose checks ride on timing
# (a batch that must outlast a sync, a kill while a batch is in flight, overlap and lag) last, when the other worker
# is done. Measured on aa9df2f (2-core AMD EPYC):
# everything under -n 2 ran two-rank tests beside the two-rank rehearsal and two of them failed (a worker was lost
# too, to the GPU check's in-process fork, which its tests now run in a fresh interpreter);
# the files not listed here, on both cores, ran 1,272 tests in 576 s of wall time (972 worker-seconds, against
# 1,263 s for the same files in the serial suite, whose 2-thread torch pools gain little on a tiny model).
SOLO_MODULES = ("test_launch_rehearsal", "test_train_distributed", "test_train_replay_distributed",
                "test_models_gptoss", "test_train_zero3_gather", "test_rollout_vllm_engine",
                "test_rollout_vllm_weight_transfer", "test_rollout_vllm_bf16", "test_eval_precision",
                "test_scripts_gpu_check", "test_launch_detached", "test_rollout_vllm_trainer", "test_rollout_vllm_sync",
                "test_train_pipeline")

# The inner loop's tier (make test-fast): pure and light modules, a subset of make test that needs no rank, engine,
# kernel or trained attempt. Prefixes, as NUMERIC_MODULES.
FAST_MODULES = ("test_algo_", "test_config", "test_data_", "test_rewards_", "test_report_units", "test_preflight_",
                "test_monitor_health", "test_evalmath", "test_eval_modes", "test_launch_plan", "test_cli_light",
                "test_docs_references", "test_envs_")


def pytest_addoption(parser):
    parser.addoption("--solo-worker", action="store_true",
                     help="with -n 2: the solo tests as one unit on one worker (in SOLO_MODULES' order), every other file a "
                          "unit of its own on either (tests/conftest.py; make test)")


def pytest_xdist_make_scheduler(config, log):
    """--solo-worker: xdist's file-by-file scheduling, except that every solo test is in one unit. (Its loadgroup
    does not group under pytest 9: it renames item._nodeid, which pytest 9's nodeid no longer reads.)"""
    if not config.getoption("solo_worker"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SoloUnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "solo" if Path(path).name.startswith(SOLO_MODULES) else path

    return SoloUnitScheduling(config, log)


def solo_rank(name: str) -> int | None:
    """The place of test file ``name`` in SOLO_MODULES (the solo worker's order), None for a file that is not solo."""
    return next((i for i, prefix in enumerate(SOLO_MODULES) if name.startswith(prefix)), None)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    if config.getoption("solo_worker"):  # solo tests first, in SOLO_MODULES' order; then the other files longest first
        items.sort(key=lambda it: ((0, solo_rank(it.path.name)) if solo_rank(it.path.name) is not None
                                   else (1, rank.get(it.path.name, len(rank)))))
    elif os.environ.get("PYTEST_XDIST_WORKER"):  # a single process keeps collection order (what CI has run green)
        items.sort(key=lambda it: rank.get(it.path.name, len(rank)))  # stable: collection order within a rank
    for item in items:
        if item.path.name.startswith(FAST_MODULES):
            item.add_marker(pytest.mark.fast)
        if item.path.name.startswith(SOLO_MODULES):
            item.add_marker(pytest.mark.solo)
        if item.path.name.startswith(NUMERIC_MODULES) and not (item.get_closest_marker("plumbing")
                                                                or item.get_closest_marker("same_kernels")):
            item.add_marker(pytest.mark.numeric)


@pytest.fixture(scope="session")
def tiny_dir():
    """The tiny locally built model (cached under .cache/models; built in seconds on first use)."""
    from rftlib.models.tiny import tiny_model_dir

    return tiny_model_dir()


@pytest.fixture
def tiny_cfg(tmp_path):
    """A config on the tiny model that trains in seconds; override fields with .replace()."""
    from rftlib.config import make_config

    def make(**kw):
        return make_config("tiny", {"runs_root": str(tmp_path / "runs"), **kw})

    return make


@pytest.fixture(scope="session")
def task_with():
    """``task_with(cfg, reward)``: the config's own task (RunConfig.task with its task_args and eval_size)
    scored by ``reward``: how a test hands the trainer its reward, ``Trainer(cfg, task=task_with(cfg, fn))``.
    A fresh task on each call (build() drops prompts longer than prompt_max_len from task.train in place),
    so a resumed Trainer gets its own. Session-scoped: a module fixture may use it."""
    from dataclasses import replace

    from rftlib.train.build import build_task

    def make(cfg, reward):
        return replace(build_task(cfg), reward=reward)

    return make


@pytest.fixture(scope="module")
def sb(request):
    """A 2-worker code sandbox pool shared by a test module. A module sets ``SANDBOX_TIMEOUT_S`` for another
    per-job wall clock (default 5 s). A machine without bubblewrap/seccomp fails the test rather than skipping
    it: CI must run the sandbox tests, so the set-up script is named."""
    from rftlib.rewards.sandbox import Sandbox, check_available

    ok, why = check_available()
    if not ok:
        pytest.fail(f"the sandbox is unavailable here ({why}): run `bash scripts/setup_sandbox.sh`")
    with Sandbox(num_workers=2, timeout_s=getattr(request.module, "SANDBOX_TIMEOUT_S", 5.0)) as box:
        yield box
