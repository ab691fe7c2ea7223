"""AReaL's launch surface: ``scheduler.type=local`` (torch's elastic launcher), ``ray`` (a local Ray
head started here) and ``slurm`` (submitit's local executor, and the sbatch script it would submit),
each running the same data-parallel path as ``accelerate launch``: two processes equal one on the same
global batch; a killed rank stops the job naming it; bad settings fail before anything starts."""

import os
import signal
import subprocess
import sys

import pytest
import torch

from .helpers import ROOT, cli, cli_env, ended, popen, step_records, wait_for, wait_until

WORKER = os.path.join(os.path.dirname(__file__), "dist_check.py")
TINY = ["--config-name", "grpo", "+scale=tiny", "train_dataset.batch_size=4", "total_train_steps=2"]


def _steps(run_dir):
    return list(step_records(run_dir, "reward/task").values())


def test_local_scheduler_two_processes_equal_one(tmp_path, monkeypatch):
    """The equality check of test_distributed.py, with the processes started by scheduler.type=local."""
    from areal_trainer.launch.local import run_local

    for k, v in cli_env().items():
        monkeypatch.setenv(k, v)
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    subprocess.run([sys.executable, WORKER, str(tmp_path / "one")], cwd=ROOT, env=cli_env(), check=True, timeout=300)
    run_local([sys.executable, WORKER, str(tmp_path / "two")], nprocs=2, run_dir=str(tmp_path / "two"))
    one = torch.load(tmp_path / "one" / "rank0.pt")
    r0, r1 = (torch.load(tmp_path / "two" / f"rank{r}.pt") for r in (0, 1))
    torch.testing.assert_close(r0["loss"], one["loss"], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(r0["delta"], one["delta"], atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(r1["delta"], r0["delta"], atol=0, rtol=0)


def test_local_scheduler_from_the_command_line(tmp_path):
    out = cli([*TINY, "scheduler.type=local", "cluster.n_gpus_per_node=2", "trial_name=loc"], cwd=tmp_path)
    run = tmp_path / "outputs" / "grpo" / "loc"
    steps = _steps(run)
    assert [r["step"] for r in steps] == [1, 2] and all(r["rollout/rows"] == 8 for r in steps)  # 2 ranks x 2 x 2
    assert "2 processes on this machine" in out.stdout and "held-out accuracy" in out.stdout
    logs = [os.path.join(d, f) for d, _, fs in os.walk(run / "logs") for f in fs if f == "stderr.log"]
    assert len(logs) == 2  # one per rank
    # The run log holds rank 0's console lines once: written by rank 0, not repeated by the launcher.
    assert (run / "__main__.log").read_text().count("held-out accuracy") == 1


def _ranks_of(launcher_pid: int) -> dict[int, int]:
    """RANK -> pid of the training processes below ``launcher_pid`` (read from /proc)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                helper = b"areal_trainer.reward" in f.read()  # a rank's reward worker inherits its environment
        except OSError:
            continue
        if not helper and b"RANK" in env and b"TORCHELASTIC_RUN_ID" in env and _descends(int(ppid), launcher_pid):
            found[int(env[b"RANK"])] = int(pid)
    return found


def _descends(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            return False
    return False


def test_a_killed_rank_stops_the_whole_job_naming_it(tmp_path):
    proc = popen([*TINY[:-1], "total_train_steps=500", "train_dataset.max_rows=2000", "scheduler.type=local",
                  "cluster.n_gpus_per_node=2", "saver.freq_steps=null", "evaluator.freq_steps=null", "trial_name=kill"],
                 cwd=tmp_path)
    run = tmp_path / "outputs" / "grpo" / "kill"
    wait_until(lambda: (run / "metrics.jsonl").exists() and len(_steps(run)) >= 2, proc, "two steps")
    ranks = _ranks_of(proc.pid)
    assert set(ranks) == {0, 1}
    os.kill(ranks[1], signal.SIGKILL)
    err = ended(proc, "killing rank 1")
    assert proc.returncode == 1
    assert "rank 1 of 2 failed" in err and "the other ranks were stopped" in err and "Traceback" not in err
    assert not _ranks_of(proc.pid)


@pytest.mark.parametrize("overrides,message", [
    (["scheduler.type=cluster"], "scheduler.type: got 'cluster'; must be one of null, 'local', 'ray', 'slurm'"),
    (["scheduler.type=local", "cluster.n_nodes=2"], "local runs on this machine only"),
    (["scheduler.type=slurm"], "there is no `sbatch` here"),
    (["scheduler.type=slurm", "scheduler.slurm_executor=local", "cluster.n_nodes=2"],
     "the local executor runs on this machine only"),
])
def test_bad_launch_settings_fail_before_anything_starts(tmp_path, overrides, message):
    proc = cli([*TINY, *overrides], cwd=tmp_path, check=False, timeout=60)
    assert proc.returncode != 0 and message in proc.stderr and "Traceback" not in proc.stderr


def test_ray_without_the_extra_says_how_to_install(tmp_path):
    env = {"PYTHONPATH": str(tmp_path / "fake")}  # a `ray` that cannot be imported
    (tmp_path / "fake" / "ray").mkdir(parents=True)
    (tmp_path / "fake" / "ray" / "__init__.py").write_text("raise ImportError('no ray here')\n")
    code = ("import sys; from areal_trainer.launch.ray_cluster import _import_ray\n"
            "try:\n    _import_ray()\nexcept Exception as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], env={**cli_env(), "PYTHONPATH": f"{env['PYTHONPATH']}:{ROOT}"},
                         capture_output=True, text=True, timeout=60).stdout
    assert "pip install -e '.[ray]'" in out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_head():
    pytest.importorskip("ray")
    port = _free_port()
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    subprocess.run([ray, "start", "--head", f"--port={port}", "--num-cpus=3", "--include-dashboard=false",
                    "--disable-usage-stats"], check=True, capture_output=True, timeout=120, env=cli_env())
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([ray, "stop", "--force"], capture_output=True, timeout=120, env=cli_env())


def test_ray_scheduler_on_a_local_head(tmp_path, ray_head):
    out = cli([*TINY, "scheduler.type=ray", f"scheduler.ray_address={ray_head}", "cluster.n_gpus_per_node=2",
               "trial_name=ray"], cwd=tmp_path, timeout=600)
    run = tmp_path / "outputs" / "grpo" / "ray"
    steps = _steps(run)
    assert [r["step"] for r in steps] == [1, 2] and all(r["rollout/rows"] == 8 for r in steps)
    assert "2 processes on the Ray cluster" in out.stdout
    assert sorted(os.listdir(run / "logs")) == ["rank0.log", "rank1.log"]
    assert "held-out accuracy" in (run / "logs" / "rank0.log").read_text()


def test_an_unreachable_ray_address_fails_fast(tmp_path):
    pytest.importorskip("ray")
    proc = cli([*TINY, "scheduler.type=ray", f"scheduler.ray_address=127.0.0.1:{_free_port()}"], cwd=tmp_path,
               check=False)
    # The address is probed before Ray is asked to connect: the probe's message, not a wait inside Ray.
    assert proc.returncode == 1 and "nothing answers there" in proc.stderr


def test_slurm_through_submitits_local_executor(tmp_path):
    pytest.importorskip("submitit")
    out = cli([*TINY, "scheduler.type=slurm", "scheduler.slurm_executor=local", "cluster.n_gpus_per_node=2",
               "trial_name=slurm"], cwd=tmp_path, timeout=600)
    run = tmp_path / "outputs" / "grpo" / "slurm"
    steps = _steps(run)
    assert [r["step"] for r in steps] == [1, 2] and all(r["rollout/rows"] == 8 for r in steps)
    assert "submitted job" in out.stdout and (run / "slurm").is_dir()


def test_the_sbatch_script_asks_for_the_nodes_tasks_and_options(tmp_path, monkeypatch):
    submitit = pytest.importorskip("submitit")
    from areal_trainer.components import load_config
    from areal_trainer.launch.slurm import slurm_parameters

    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", staticmethod(lambda: 1))  # no srun here
    cfg = load_config("grpo", ["cluster.n_nodes=2",
                               "cluster.n_gpus_per_node=8", "scheduler.slurm_partition=gpu",
                               "scheduler.slurm_account=rl", "scheduler.slurm_time_min=90",
                               "+scheduler.slurm_sbatch_args.qos=high"])
    executor = submitit.AutoExecutor(folder=str(tmp_path), cluster="slurm")
    executor.update_parameters(**slurm_parameters(cfg, nprocs=8))
    script = executor._executor._make_submission_file_text("python -m areal_trainer", "uid")
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --partition=gpu", "#SBATCH --account=rl", "#SBATCH --time=90", "#SBATCH --qos=high",
                 "srun"):
        assert line in script, line


def test_sigterm_to_the_local_launcher_stops_every_rank(tmp_path):
    proc = popen([*TINY[:-1], "total_train_steps=500", "train_dataset.max_rows=2000", "scheduler.type=local",
                  "cluster.n_gpus_per_node=2",
                  "saver.freq_steps=2", "evaluator.freq_steps=null", "trial_name=term"], cwd=tmp_path)
    run = tmp_path / "outputs" / "grpo" / "term"
    wait_for(run / "checkpoints" / "step_2" / "COMPLETE", proc)
    proc.send_signal(signal.SIGTERM)
    err = ended(proc, "SIGTERM")
    assert proc.returncode == 143 and "Stopped by SIGTERM" in err and "Traceback" not in err
    assert not _ranks_of(proc.pid)
