"""Batch jobs against the real Slurm cluster that slurm/cluster.sh brings up (two nodes, slurmdbd)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import hpcdl
from hpcdl import JobFailedError
from tests.conftest import job_folders

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="session", autouse=True)
def slurm_cluster() -> None:
    """The cluster must answer; CI (HPCDL_REQUIRE_SLURM=1) fails instead of skipping."""
    try:
        up = subprocess.run(["sinfo", "-h"], capture_output=True, text=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        up = False
    if not up:
        message = "no Slurm cluster answers: run `bash slurm/cluster.sh up`"
        if os.environ.get("HPCDL_REQUIRE_SLURM"):
            pytest.fail(message)
        pytest.skip(message)


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, check=check, timeout=300)


def _queue() -> set[str]:
    return set(subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                              check=True).stdout.split())


def _sacct_state(slurm_id: str) -> str:
    """Slurm's own final word on a job (it may still be winding down when hpcdl already knows)."""
    state = ""
    for _ in range(120):
        out = subprocess.run(["sacct", "-n", "-P", "-X", "-o", "State", "-j", slurm_id], capture_output=True,
                             text=True).stdout.split()
        state = out[0] if out else ""
        if state and state not in ("PENDING", "RUNNING", "COMPLETING"):
            return state
        time.sleep(0.5)
    return state


def square(x: float) -> float:
    return x * x


def read_variables(*names: str) -> list[str | None]:
    return [os.environ.get(name) for name in names]


def fail() -> None:
    raise ValueError("bad learning rate")


def wait_running(job: hpcdl.lifecycle.job.Job, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while job.refresh().status.get("state") != "RUNNING":
        assert time.monotonic() < deadline, f"job {job.id} did not start: {job.state}"
        time.sleep(0.2)


def test_training_job_completes_on_slurm_and_is_fetched_from_a_new_process(store: Path, digits_root: Path,
                                                                           tmp_path: Path) -> None:
    done = _cli("hpcdl.submit", "cluster=slurm", f"data.root={digits_root}", "training.max_epochs=2",
                "cluster.time=00:10:00", "cluster.mem=1000M", "name=digits-slurm")
    job_id = done.stdout.split()[2]
    slurm_id = done.stdout.split("(Slurm job ")[1].split(")")[0]
    assert _cli("hpcdl.jobs", "wait", job_id, "--timeout", "240").stdout.strip() == "COMPLETED"
    assert _sacct_state(slurm_id) == "COMPLETED"
    fetched = _cli("hpcdl.jobs", "fetch", slurm_id, "--to", str(tmp_path / "got"))  # by Slurm's id too
    assert "validation_accuracy: 0." in fetched.stdout and (tmp_path / "got" / "model.pt").is_file()
    listing = _cli("hpcdl.jobs", "list", "--name", "digits-slurm").stdout.splitlines()
    assert len(listing) == 2 and "COMPLETED" in listing[1] and "slurm" in listing[1]
    assert "Training finished: max-epochs" in _cli("hpcdl.jobs", "logs", job_id).stdout


def test_batch_function_runs_on_slurm_and_its_result_is_read_from_a_new_process(store: Path) -> None:
    job = hpcdl.batch(square, 12.0, cluster="slurm", time="00:05:00")
    code = f"import hpcdl.lifecycle.job as j; print(j.Job.attach({job.backend_id!r}).result(timeout=180))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "144.0"
    assert _sacct_state(job.backend_id) == "COMPLETED"


def test_failing_job_is_failed_with_its_traceback(store: Path) -> None:
    job = hpcdl.batch(fail, cluster="slurm", time="00:05:00")
    assert job.wait(timeout=180) == "FAILED"
    with pytest.raises(JobFailedError, match="bad learning rate"):
        job.result()
    shown = _cli("hpcdl.jobs", "show", job.id).stdout
    assert "state     FAILED" in shown and "ValueError: bad learning rate" in shown


def test_cancel_ends_a_running_slurm_job(store: Path) -> None:
    job = hpcdl.batch(time.sleep, 600, cluster="slurm", time="00:15:00")
    wait_running(job)
    assert job.backend_id in _queue()
    _cli("hpcdl.jobs", "cancel", job.id)
    assert job.state == "CANCELLED"
    assert job.backend_id not in _queue()
    assert _sacct_state(job.backend_id).startswith("CANCELLED")


def test_job_killed_without_a_result_is_failed_even_when_slurm_says_otherwise(store: Path) -> None:
    import signal

    job = hpcdl.batch(os.kill, os.getpid() * 0, signal.SIGKILL, cluster="slurm", time="00:05:00")
    assert job.wait(timeout=180) == "FAILED"
    assert "ended without a result" in job.refresh().reason


def test_hostile_job_name_is_submitted_verbatim_and_runs_nothing(store: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    name = f"net'; touch {marker}; echo \"$(touch {marker})\""
    job = hpcdl.batch(square, 3.0, cluster="slurm", name=name, time="00:05:00")
    assert job.result(timeout=180) == 9.0
    shown = subprocess.run(["scontrol", "show", "job", "-o", job.backend_id], capture_output=True, text=True,
                           check=True).stdout  # the controller keeps ended jobs for MinJobAge seconds
    assert shown.split(" JobName=", 1)[1].split(" UserId=")[0] == name
    assert not marker.exists()


def test_allow_listed_variables_travel_and_secrets_stay_out(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = f"tok-{secrets.token_hex(8)}"  # made at run time: no file of the code snapshot holds it
    monkeypatch.setenv("MY_SERVICE_TOKEN", token)
    monkeypatch.setenv("LANG", "C.UTF-8")
    job = hpcdl.batch(read_variables, "MY_SERVICE_TOKEN", "LANG", cluster="slurm", time="00:05:00")
    assert job.result(timeout=180) == [None, "C.UTF-8"]  # the allow-list travels, the token does not
    for path in job.folder.rglob("*"):
        if path.is_file():
            assert token.encode() not in path.read_bytes(), path


def test_dry_run_prints_the_sbatch_script_and_submits_nothing(store: Path) -> None:
    before = _queue()
    done = _cli("hpcdl.submit", "cluster=slurm", "dry_run=true", "+cluster.env.NCCL_DEBUG=INFO")
    assert done.stdout.startswith("#!/bin/bash") and "#SBATCH --time=60" in done.stdout
    assert "export NCCL_DEBUG=INFO" in done.stdout and "dry run: nothing was submitted" in done.stdout
    assert not _queue() - before and job_folders(store) == []


@pytest.mark.parametrize(("overrides", "message"), [
    (["cluster=nosuchcluster"], "cluster=nosuchcluster: no such option in group cluster"),
    (["cluster.partition=gpu"], "cluster.partition: 'gpu' is not a partition of this cluster; choose one of debug"),
    (["cluster.gpus_per_node=2"], "cluster.gpus_per_node=2: the nodes of partition debug offer at most 0 GPU(s)"),
    (["cluster.nodes=3", "training.execution_environment=parallel"], "cluster.nodes=3: partition debug has 2 node(s)"),
    (["cluster.time=1.5h"], "cluster.time: '1.5h' is not a Slurm time limit"),
    (["cluster.python=/opt/none/bin/python"], "cluster.python: '/opt/none/bin/python' is not an executable"),
    (["cluster.cpus_per_task=64"], "the nodes of partition debug have 4 CPUs"),
])
def test_bad_submission_is_refused_before_anything_reaches_slurm(store: Path, overrides: list[str],
                                                                 message: str) -> None:
    before = _queue()
    done = _cli("hpcdl.submit", "cluster=slurm", *overrides, check=False)
    assert done.returncode == 2
    assert message in done.stderr
    assert not _queue() - before and job_folders(store) == []


def test_sbatch_refusal_removes_the_job_folder(store: Path) -> None:
    done = _cli("hpcdl.submit", "cluster=slurm", "+cluster.sbatch_extra.begin=not-a-time", check=False)
    assert done.returncode == 2 and "sbatch refused the job" in done.stderr
    assert job_folders(store) == []


MPIRUN_LOOPBACK = "cluster.mpirun=[mpirun,--mca,btl,self\\,tcp,--mca,btl_tcp_if_include,lo,--mca,oob_tcp_if_include,lo]"


def _launched_with(comm: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The overrides that start a job's ranks for ``comm`` here: torch (srun), or mpi (mpirun on loopback, root)."""
    if comm != "mpi":
        return []
    pytest.importorskip("mpi4py")
    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1")
    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return [MPIRUN_LOOPBACK]


def slurm_setting(name: str) -> str:
    """A value of the running cluster's configuration (scontrol show config)."""
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True).stdout
    return next(line.split("=", 1)[1].strip() for line in config.splitlines() if line.split("=")[0].strip() == name)


@pytest.mark.parametrize("comm", ["torch", "mpi"])
def test_two_node_job_trains_across_both_nodes(store: Path, digits_root: Path, comm: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    extra = _launched_with(comm, monkeypatch)
    done = _cli("hpcdl.submit", "cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=1",
                "training.execution_environment=parallel", f"training.comm={comm}", f"data.root={digits_root}",
                "training.max_epochs=2", "cluster.time=00:10:00", f"name=two-nodes-{comm}", *extra)
    from hpcdl.lifecycle.job import Job

    job = Job.attach(done.stdout.split()[2])
    assert job.wait(timeout=300) == "COMPLETED", job.error()
    summary = job.result()
    assert summary["validation_accuracy"] > 0.5
    logs = job.logs(0) + job.logs(1)
    assert "rank 0/2" in logs and "rank 1/2" in logs and f"via {'mpi' if comm == 'mpi' else 'slurm'}" in logs
    hosts = subprocess.run(["sacct", "-n", "-P", "-X", "-o", "NodeList", "-j", job.backend_id],
                           capture_output=True, text=True).stdout.strip()
    assert hosts == "n[1-2]"


def test_a_rank_killed_mid_training_fails_the_job_fast_naming_it(store: Path) -> None:
    from tests.distributed_training import train

    job = hpcdl.batch(train, "/dev/null", None, "torch", 1, 4, cluster="slurm", nodes=2, time="00:10:00",
                          collective_timeout_s=60)
    start = time.monotonic()
    assert job.wait(timeout=240) == "FAILED"
    assert time.monotonic() - start < 120  # well inside the 10-minute limit
    shown = _cli("hpcdl.jobs", "show", job.id).stdout
    assert "task 1" in shown, shown


def test_a_lost_rank_ends_the_job_at_once_though_the_others_wait_in_no_collective(store: Path) -> None:
    from tests.payloads import lose_rank_one

    # rank 0 sleeps, in no collective and with no heartbeat watch: only srun's --kill-on-bad-exit ends it
    # before the 10-minute limit
    job = hpcdl.batch(lose_rank_one, 600, cluster="slurm", nodes=2, time="00:10:00", heartbeat_timeout_s=0)
    submitted = time.monotonic()
    assert job.wait(timeout=150) == "FAILED"
    assert time.monotonic() - submitted < 90  # start-up and Slurm's KillWait (10 s) included; rank 0 sleeps 600
    assert _sacct_state(job.backend_id) in ("FAILED", "CANCELLED")
    shown = _cli("hpcdl.jobs", "show", job.id).stdout
    assert "task 1" in shown, shown


def test_a_stopped_rank_fails_the_job_fast_naming_it_and_its_node(store: Path, digits_root: Path) -> None:
    import json
    import signal

    done = _cli("hpcdl.submit", "cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=1",
                "training.execution_environment=parallel", f"data.root={digits_root}", "training.max_epochs=1000",
                "training.mini_batch_size=16", "training.verbose=false", "cluster.heartbeat_timeout_s=5",
                "cluster.time=00:10:00")
    job_id = done.stdout.split()[2]
    beat = store / job_id / "heartbeats" / "rank1.json"
    deadline = time.monotonic() + 120
    while not (beat.is_file() and json.loads(beat.read_text())["stepped"]):
        assert time.monotonic() < deadline, _cli("hpcdl.jobs", "show", job_id).stdout
        time.sleep(0.5)
    record = json.loads(beat.read_text())
    os.kill(record["pid"], signal.SIGSTOP)  # both slurmd run on this machine
    stopped = time.monotonic()
    try:
        assert _cli("hpcdl.jobs", "wait", job_id, "--timeout", "120", check=False).stdout.strip() == "FAILED"
        assert time.monotonic() - stopped < 60
        shown = _cli("hpcdl.jobs", "show", job_id).stdout
        assert f"rank 1 (host n2, pid {record['pid']}) sent no heartbeat" in shown, shown
        while Path(f"/proc/{record['pid']}").exists():  # srun's kill-on-bad-exit ends the stopped rank
            assert time.monotonic() - stopped < 90
            time.sleep(0.5)
    finally:
        if Path(f"/proc/{record['pid']}").exists():
            os.kill(record["pid"], signal.SIGKILL)


def test_own_network_and_dataset_train_on_both_nodes_from_the_users_folder(store: Path, tmp_path: Path) -> None:
    from tests.user_parts import write_user_code

    user = write_user_code(tmp_path / "user")
    done = subprocess.run(
        [sys.executable, "-m", "hpcdl.submit", "cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=1",
         "training.execution_environment=parallel", "data._target_=mynets.make_blobs", "+data.n=120",
         "model._target_=mynets.MyNet", "+model.hidden=6", "training.max_epochs=2", "cluster.time=00:10:00",
         "name=own-parts"], capture_output=True, text=True, timeout=300, cwd=user)
    assert done.returncode == 0, done.stderr
    from hpcdl.lifecycle.job import Job

    job = Job.attach(done.stdout.split()[2])
    assert job.wait(timeout=300) == "COMPLETED", job.error()
    summary = job.result()
    assert summary["config"]["model"]["args"] == {"hidden": 6} and summary["classes"] == ["a", "b", "c"]
    state = torch.load(job.folder / "model.pt", weights_only=True)
    assert state["body.1.weight"].shape == (6, 16)  # MyNet(hidden=6) on 1x4x4 inputs, built on every rank
    logs = job.logs(0) + job.logs(1)
    assert "rank 0/2" in logs and "rank 1/2" in logs


def _iterations(folder: Path) -> list[int]:
    import json

    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [r["iteration"] for r in records if r["kind"] == "iteration"]


def test_a_time_limit_stops_the_job_with_a_checkpoint_and_resume_passes_a_truncated_one_over(
        store: Path, digits_root: Path) -> None:
    """Slurm's own time-limit signal (#SBATCH --signal=USR2@75 of a 2-minute limit) comes 15-45 s in (slurmctld
    looks every 30 s and may send it up to that much early): the job stops with a checkpoint before the limit,
    STOPPED with no requeue left, and Slurm calls it COMPLETED, not TIMEOUT. Its newest checkpoint cut short,
    jobs resume goes on from the one before, naming the damaged one. The training (150 epochs, about 90 s on a
    2-core machine) outlasts the latest signal: 60 epochs (35 s) once finished before a signal that came late."""
    from hpcdl.lifecycle.job import Job

    done = _cli("hpcdl.submit", "cluster=slurm", f"data.root={digits_root}", "training.max_epochs=150",
                "training.mini_batch_size=32", "cluster.time=00:02:00", "cluster.signal_delay_s=75",
                "cluster.max_requeues=0", "training.verbose=false", "name=time-limit")
    job = Job.attach(done.stdout.split()[2])
    assert job.wait(timeout=150) == "STOPPED", job.error()
    stopped_after(job)
    assert _sacct_state(job.backend_id) == "COMPLETED"
    elapsed = subprocess.run(["sacct", "-n", "-P", "-X", "-o", "ElapsedRaw", "-j", job.backend_id],
                             capture_output=True, text=True, check=True).stdout.split()[0]
    assert int(elapsed) < 120
    checkpoints = _checkpoint_iterations(job.folder)
    newest = job.folder / "checkpoints" / f"checkpoint-{checkpoints[-1]:09d}.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    first_slurm_id = job.backend_id
    # the rest of 150 epochs took 3.5 min on a loaded 2-core machine: a 5-minute limit's signal came before
    assert "resumed" in _cli("hpcdl.jobs", "resume", job.id, "--time", "00:10:00").stdout
    job = Job.attach(job.id)
    assert job.backend_id != first_slurm_id  # a new Slurm job in the same record
    assert job.wait(timeout=540) == "COMPLETED", job.error()
    assert f"checkpoint {newest} is damaged" in job.logs(0, "stderr")
    assert f"Resumed from the checkpoint of iteration {checkpoints[-2]}" in job.logs(0)  # kept: 2, one an epoch
    assert _iterations(job.folder) == list(range(1, job.result()["iterations"] + 1))


@pytest.mark.parametrize("comm", ["torch", "mpi"])
def test_the_signal_sent_to_the_batch_shell_alone_stops_every_rank_with_a_checkpoint(
        store: Path, digits_root: Path, comm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """scancel --signal=USR2 --batch reaches the batch shell only: it hands the signal on to srun or mpirun."""
    from hpcdl.lifecycle.job import Job

    extra = _launched_with(comm, monkeypatch)
    done = _cli("hpcdl.submit", "cluster=slurm", "cluster.nodes=2", "training.execution_environment=parallel",
                f"training.comm={comm}", f"data.root={digits_root}", "training.max_epochs=100",
                "training.mini_batch_size=32", "cluster.max_requeues=0", "cluster.time=00:10:00",
                f"name=batch-signal-{comm}", *extra)
    job = Job.attach(done.stdout.split()[2])
    deadline = time.monotonic() + 120
    while not ((job.folder / "metrics.jsonl").is_file() and (job.folder / "metrics.jsonl").read_text().strip()):
        assert time.monotonic() < deadline, job.error()
        time.sleep(0.5)
    subprocess.run(["scancel", "--signal=USR2", "--batch", job.backend_id], check=True)
    assert job.wait(timeout=120) == "STOPPED", job.error()
    stopped = stopped_after(job)
    assert stopped in _checkpoint_iterations(job.folder)
    assert _iterations(job.folder) == list(range(1, stopped + 1))
    assert _sacct_state(job.backend_id) == "COMPLETED"  # the batch shell lived on and ended as its ranks did


def stopped_after(job: hpcdl.lifecycle.job.Job) -> int:
    """The iteration a job stopped by the stop signal stopped after, from its reason."""
    reason = job.refresh().reason
    assert "stopped on SIGUSR2 after iteration" in reason, reason
    return int(reason.split("after iteration ")[1].split(",")[0])


def _checkpoint_iterations(folder: Path) -> list[int]:
    from hpcdl.store.files import checkpoint_files

    return [iteration for iteration, _ in checkpoint_files(folder / "checkpoints")]


def test_a_torchrun_style_script_runs_across_both_nodes(store: Path, tmp_path: Path) -> None:
    from hpcdl.lifecycle.job import Job
    from tests.user_code import write_user_code

    user = write_user_code(tmp_path / "user")
    done = subprocess.run([sys.executable, "-m", "hpcdl.submit", "cluster=slurm", "cluster.nodes=2",
                           "script=train_ddp.py", "cluster.time=00:10:00", "name=script-2n", "--", "--steps", "3"],
                          capture_output=True, text=True, timeout=300, cwd=user)
    assert done.returncode == 0, done.stderr
    job = Job.attach(done.stdout.split()[2])
    assert job.result(timeout=300) == {"world": 2, "final_loss": pytest.approx(job.result()["final_loss"])}
    assert "script rank 0 of 2 local 0: sum 3" in job.logs(0)
    assert "script rank 1 of 2 local 0: sum 3" in job.logs(1)  # its own log, on the other node
    hosts = subprocess.run(["sacct", "-n", "-P", "-X", "-o", "NodeList", "-j", job.backend_id],
                           capture_output=True, text=True).stdout.strip()
    assert hosts == "n[1-2]"


def test_a_script_stopped_on_both_nodes_by_the_signal_resumes_where_its_ranks_agreed(store: Path,
                                                                                    tmp_path: Path) -> None:
    from hpcdl.lifecycle.job import Job
    from tests.test_user_resume import SCRIPT

    user = tmp_path / "user"
    user.mkdir()
    (user / "steps.py").write_text(SCRIPT)
    steps = 600
    done = subprocess.run([sys.executable, "-m", "hpcdl.submit", "cluster=slurm", "cluster.nodes=2",
                           "script=steps.py", "cluster.time=00:10:00", "cluster.max_requeues=0", "name=script-stop",
                           "--", str(steps)], capture_output=True, text=True, timeout=300, cwd=user)
    assert done.returncode == 0, done.stderr
    job = Job.attach(done.stdout.split()[2])
    deadline = time.monotonic() + 120
    while not any((job.folder / "checkpoints").glob("checkpoint-*.pt")):
        assert time.monotonic() < deadline, job.error()
        time.sleep(0.5)
    subprocess.run(["scancel", "--signal=USR2", job.backend_id], check=True)  # to every step's tasks
    assert job.wait(timeout=120) == "STOPPED", job.error()
    import json

    stopped = json.loads((job.folder / "final.json").read_text())["iteration"]
    assert 0 < stopped < steps
    assert f"rank 1 stops after step {stopped}" in job.logs(1)
    assert "resumed" in _cli("hpcdl.jobs", "resume", job.id).stdout
    job = Job.attach(job.id)
    assert job.wait(timeout=240) == "COMPLETED", job.error()
    assert f"rank 1 starts after step {stopped}" in job.logs(1)
    assert job.result() == {"total": 2 * steps * (steps + 1) / 2, "steps": steps}


TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def test_a_batch_function_gets_torchruns_variables_on_each_slurm_rank(store: Path) -> None:
    job = hpcdl.batch(read_variables, *TORCHRUN_VARIABLES, cluster="slurm", nodes=2, time="00:05:00",
                      all_ranks=True)
    ranks = job.result(timeout=180)
    assert [r[:4] for r in ranks] == [["0", "2", "0", "1"], ["1", "2", "0", "1"]]
    assert ranks[0][4:] == ranks[1][4:] and all(ranks[0][4:])  # one master for both


def test_a_slurm_rank_that_raises_is_named_with_its_host_and_own_traceback(store: Path, tmp_path: Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    (user / "one_fails.py").write_text(
        "import os, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    raise RuntimeError('rank 1 ran out of data')\n"
        "time.sleep(20)\n")
    done = subprocess.run([sys.executable, "-m", "hpcdl.submit", "cluster=slurm", "cluster.nodes=2",
                           "script=one_fails.py", "cluster.time=00:05:00"], capture_output=True, text=True,
                          timeout=300, cwd=user)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split()[2]
    assert _cli("hpcdl.jobs", "wait", job_id, "--timeout", "180", check=False).stdout.strip() == "FAILED"
    error = _cli("hpcdl.jobs", "show", job_id).stdout.split("--- error ---\n")[1]
    assert error.startswith("rank 1 on n2:\nTraceback (most recent call last):\n"), error
    assert 'one_fails.py", line 3, in <module>' in error and "RuntimeError: rank 1 ran out of data" in error
    assert "ScriptFailed" not in error
