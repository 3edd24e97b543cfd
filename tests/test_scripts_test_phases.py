"""make test's scheduling (scripts/test.sh, tests/conftest.py): under ``pytest -n 2 --solo-worker`` every solo test
runs on one worker, one at a time in SOLO_MODULES' order, while the other worker takes the rest. Were the solo tests spread over both
workers, two launches or rank jobs would run side by side on 2 cores, and fail or time out now and then rather than
here. (xdist's own ``--dist loadgroup`` did exactly that under pytest 9.2, silently: issue 41.)

Runs a small pytest in a subprocess: plumbing tests of three solo modules and two files of the rest, none of which
starts a rank or an engine."""

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOLO = ("test_train_distributed.py::test_torchrun_command_for_one_and_two_nodes",
        "test_smoke.py::test_table_and_verdict",  # not solo since issue 41: on either worker
        "test_rollout_vllm_sync.py::test_probe_judges_every_sync_against_the_noise_it_measures",
        "test_train_pipeline.py::test_the_dry_run_promises_no_wait_that_no_code_does")
REST = ("test_algo_schedule.py", "test_algo_kl_agg.py")


def test_solo_tests_run_on_one_worker_in_solo_order_and_the_rest_on_the_other(tmp_path):
    import conftest

    args = [f"tests/{s}" for s in SOLO] + [f"tests/{f}" for f in REST]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # not this run's xdist worker
    p = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "2", "--solo-worker",
                        "--dist", "loadfile", "--no-loadscope-reorder", f"--basetemp={tmp_path / 'inner'}", *args],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    ran = re.findall(r"\[(gw\d)\] .*?PASSED (tests/\S+)", p.stdout)  # (worker, nodeid) in the order they finished
    solo = [(w, n) for w, n in ran if Path(n.split("::")[0]).name.startswith(conftest.SOLO_MODULES)]
    rest = [(w, n) for w, n in ran if (w, n) not in solo]
    assert len(solo) == 3 and len({w for w, _ in solo}) == 1, ran  # one worker runs every solo test
    assert rest and {w for w, _ in rest} - {solo[0][0]}, ran  # and the other runs the rest
    order = [conftest.solo_rank(Path(n.split("::")[0]).name) for _, n in solo]
    assert order == sorted(order), solo  # in SOLO_MODULES' order
