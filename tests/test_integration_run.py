"""``ranksight run``: an unmodified script (the docs' example) under torchrun and plain python."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ranksight.collectors import open_run, read_rank_meta

from .test_integration_support import (
    assert_diagnosis,
    assert_input_bound_vs_healthy,
    assert_two_ranks_recorded,
    breakdown,
    example,
    run_job,
)

pytestmark = pytest.mark.slow

STEPS = 12
RANKSIGHT = [sys.executable, "-m", "ranksight"]
TORCHRUN_ARGS = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def _clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSIGHT_")}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("zero-edit")
    runs_dir = str(tmp / "runs")
    paths = {}
    for name, flags in (("slow", ["--slow-data"]), ("healthy", [])):
        cmd = RANKSIGHT + ["run", "--run-dir", runs_dir, "--job", "plain", "--run-id", f"plain-{name}", "--"]
        cmd += [sys.executable, *TORCHRUN_ARGS, example("plain_train.py"), "--steps", str(STEPS), *flags]
        run_job(cmd, cwd=str(tmp), run_id=None)
        paths[name] = os.path.join(runs_dir, f"plain-{name}")
    return paths


def test_unmodified_script_gets_per_rank_records_for_both_ranks(runs):
    # One step per optimizer step on each rank; the torchrun launcher process records nothing.
    for path in runs.values():
        assert_two_ranks_recorded(path, STEPS)
        assert open_run(path).execute("SELECT DISTINCT job FROM steps").fetchall() == [("plain",)]


def test_data_wait_dominates_only_with_the_slow_loader(runs):
    assert_input_bound_vs_healthy(breakdown(runs["slow"]), breakdown(runs["healthy"]))
    assert_diagnosis(runs["slow"], runs["healthy"])


def test_model_is_found_after_the_first_optimizer_step(runs):
    con = open_run(runs["healthy"])
    rows = con.execute(
        "SELECT step, compute_s IS NOT NULL, buckets IS NOT NULL, optimizer_s IS NOT NULL FROM steps WHERE rank = 0"
        " ORDER BY step"
    ).fetchall()
    assert rows[0][1:] == (False, False, True)  # step 0: only the optimizer hooks know anything yet
    assert all(r[1:] == (True, True, True) for r in rows[1:]), rows  # then the DDP model is watched


def test_plain_python_as_a_slurm_task(tmp_path):
    # `srun ranksight run -- python train.py`: one task, no run id given: the run is the SLURM job step's.
    runs_dir = str(tmp_path / "runs")
    slurm = dict(SLURM_JOB_ID="4242", SLURM_STEP_ID="0", SLURM_PROCID="0", SLURM_NTASKS="1", SLURM_LOCALID="0")
    cmd = RANKSIGHT + ["run", "--run-dir", runs_dir, "--", sys.executable, example("plain_train.py"), "--steps", "6"]
    proc = subprocess.run(cmd, env=_clean_env(SLURM_NODEID="0", **slurm), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = os.path.join(runs_dir, "default-slurm4242.0")
    assert f"records in {path}" in proc.stderr
    con = open_run(path)
    assert con.execute("SELECT rank, world_size, count(*) FROM steps GROUP BY ALL").fetchall() == [(0, 1, 6)]
    assert [m.status for m in read_rank_meta(path)] == ["finished"]


def test_default_run_id_is_fresh_per_launch(monkeypatch):
    import argparse

    from ranksight.commands.run import _run_id

    monkeypatch.delenv("RANKSIGHT_RUN_ID", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    args = argparse.Namespace(run_id="", job="exp")
    first, second = _run_id(args), _run_id(args)
    assert first.startswith("exp-") and second.startswith("exp-") and first != second
    assert _run_id(argparse.Namespace(run_id="mine", job="exp")) == "mine"
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    assert _run_id(args) == ""  # every node derives exp-[<start>-]slurm77[.step] itself


def test_exit_code_passes_through_and_other_sitecustomize_still_runs(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    marker = tmp_path / "marker"
    (site / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    probe = (
        "import sys, torch\n"
        "from torch.utils.data import DataLoader\n"
        "print('patched' if getattr(DataLoader.__iter__, '_ranksight', False) else 'plain')\n"
        "sys.exit(3)\n"
    )
    cmd = RANKSIGHT + ["run", "--run-dir", str(tmp_path / "runs"), "--quiet", "--", sys.executable, "-c", probe]
    proc = subprocess.run(cmd, env=_clean_env(PYTHONPATH=str(site)), capture_output=True, text=True)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.strip() == "patched"
    assert marker.read_text() == "ran"


def test_loop_without_a_dataloader_gets_steps_between_optimizer_steps(tmp_path):
    loop = (
        "import torch\n"
        "model = torch.nn.Linear(8, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x in [torch.randn(4, 8) for _ in range(6)]:\n"
        "    model(x).sum().backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n"
    )
    runs_dir = str(tmp_path / "runs")
    cmd = RANKSIGHT + ["run", "--run-dir", runs_dir, "--run-id", "lists", "--quiet", "--", sys.executable, "-c", loop]
    proc = subprocess.run(cmd, env=_clean_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = (
        open_run(os.path.join(runs_dir, "lists"))
        .execute("SELECT step, data_wait_s, compute_s IS NOT NULL, optimizer_s IS NOT NULL FROM steps ORDER BY step")
        .fetchall()
    )
    # 6 optimizer steps bound 5 steps; no loader, so no data wait; the model is found in the first one.
    assert rows == [(s, None, True, True) for s in range(5)]


def test_without_ranksight_run_nothing_is_patched(tmp_path):
    probe = "from torch.utils.data import DataLoader; print(hasattr(DataLoader.__iter__, '_ranksight'))"
    proc = subprocess.run([sys.executable, "-c", probe], env=_clean_env(), capture_output=True, text=True)
    assert proc.stdout.strip() == "False"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run"], "give the command to run after --, e.g. ranksight run -- python train.py"),
        (["run", "--", "no-such-command-xyz"], "no-such-command-xyz: command not found"),
    ],
)
def test_bad_command_line_is_one_line_and_exit_2(argv, message):
    proc = subprocess.run(RANKSIGHT + argv, env=_clean_env(), capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"ranksight run: {message}"]
