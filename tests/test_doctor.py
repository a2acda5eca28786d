"""The job doctor on the local profile: injected faults, each with what `jobs why` prints (root cause first)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hpcdl.distributed import failures, stacks
from hpcdl.distributed.flight_recorder import missing_ranks
from hpcdl.lifecycle.diagnosis import judge, launcher_records
from hpcdl.store.files import FAILURE, FAILURES, LOGS, MANIFEST, STACKS
from tests import faults
from tests.faults import (MPIRUN_HERE, cli, hang_verdict, heartbeat_of, mpirun_export, root_line, submit,
                         verdict_after, wait_for, write_faults)

HOST = socket.gethostname()
FAST = ("cluster.tasks_per_node=4", "cluster.heartbeat_timeout_s=5", "cluster.time=00:05:00")


def fail_on_rank_1(message: str) -> None:
    """A hpcdl.batch function: rank 1 raises while rank 0 waits for it in an all-reduce."""
    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10))
    if dist.get_rank() == 1:
        raise RuntimeError(message)
    dist.all_reduce(torch.ones(1))


def _record_time(folder: Path, rank: int) -> float:
    return json.loads((folder / FAILURES / FAILURE.format(rank=rank)).read_text())["time"]


def test_failures_are_told_causes_or_victims() -> None:
    assert not failures.is_consequence("ValueError", "rank 1 fails on purpose")
    assert not failures.is_consequence("OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB")
    assert failures.is_consequence("DistBackendError", "[../gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
                                                       "waiting 10000ms for recv operation to complete")
    assert failures.is_consequence("RuntimeError", "[../gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                                                   "[127.0.0.1]:3456")
    assert failures.is_consequence("DistBackendError", "NCCL communicator was aborted on rank 0.")


USERS_OWN_TIMEOUT = """Traceback (most recent call last):
  File "/home/u/train.py", line 12, in <module>
    batch = next(batches)
  File "/venv/lib/python3.12/site-packages/torch/utils/data/dataloader.py", line 1298, in _get_data
    raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")
RuntimeError: DataLoader timed out after 5 seconds"""
PEERS_TIMEOUT = """Traceback (most recent call last):
  File "/home/u/train.py", line 14, in <module>
    loss.backward()
  File "/venv/lib/python3.12/site-packages/torch/autograd/graph.py", line 829, in _engine_run_backward
    return Variable._execution_engine.run_backward(
RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 10000ms for recv"""


def test_a_timeout_is_a_victims_only_where_the_communication_layer_says_it() -> None:
    """A DataLoader's or a request's timeout in the user's own code is a cause; DDP's gradient all-reduce timing
    out in backward names gloo in its message though no frame is torch.distributed's."""
    assert not failures.is_consequence("RuntimeError", "DataLoader timed out after 5 seconds", USERS_OWN_TIMEOUT)
    assert not failures.is_consequence("TimeoutError", "The read operation timed out",
                                       'Traceback (most recent call last):\n  File "/home/u/fetch.py", line 3, in '
                                       'get\nTimeoutError: The read operation timed out')
    assert failures.is_consequence("RuntimeError", PEERS_TIMEOUT.splitlines()[-1].split(": ", 1)[1], PEERS_TIMEOUT)
    assert failures.is_consequence("DistStoreError", "Timed out after 901 seconds waiting for clients",
                                   'Traceback (most recent call last):\n  File "/home/u/t.py", line 2, in <module>\n'
                                   'torch.distributed.DistStoreError: Timed out after 901 seconds')
    assert failures.exception_line("Traceback (most recent call last):\n  File \"a.py\", line 1, in <module>\n"
                                   "torch.distributed.DistBackendError: Connection reset by peer") == \
        ("DistBackendError", "Connection reset by peer")
    assert failures.exception_line("some last words") == ("", "some last words")
    assert failures.exception_line("Warning: no traceback here") == ("", "Warning: no traceback here")


def test_srun_and_mpirun_name_the_rank_a_signal_ended() -> None:
    srun = ("srun: error: n2: task 3: Killed\nsrun: Terminating StepId=5.0\n"
            "srun: error: n1: tasks 0-2: Killed\n")
    assert [(e["rank"], e["host"], e["message"]) for e in launcher_records(srun)] == [(3, "n2", "Killed (srun)")]
    assert launcher_records("srun: error: n1: task 1: Exited with exit code 1\n") == []  # it recorded itself
    mpirun = "mpirun noticed that process rank 1 with PID 4242 on node n1 exited on signal 9 (Killed).\n"
    assert [(e["rank"], e["pid"], e["message"]) for e in launcher_records(mpirun)] == \
        [(1, 4242, "signal 9 (Killed) (mpirun)")]


def test_stacks_are_grouped_and_the_rank_outside_the_collective_is_the_outlier() -> None:
    waiting = [["train.py", 10, "main", ""], ["torch/distributed/c10d_logger.py", 81, "wrapper", ""],
               ["torch/distributed/distributed_c10d.py", 2800, "all_reduce", ""]]
    napping = [["train.py", 12, "main", ""], ["train.py", 20, "nap", "time.sleep(60)"]]
    found = {0: {"main": waiting}, 1: {"main": waiting}, 2: {"main": napping}, 3: {"main": waiting}}
    grouped = stacks.groups(found)
    assert [ranks for ranks, _ in grouped] == [[0, 1, 3], [2]]
    assert stacks.outliers(grouped) == [([2], napping)]
    assert stacks.outliers(stacks.groups({0: {"main": waiting}, 1: {"main": waiting}})) == []
    assert missing_ranks({0: (41, "nccl:all_reduce"), 1: (40, "nccl:all_reduce"), 3: (41, "nccl:all_reduce")}, 4) \
        == "flight recorder: rank(s) 1,2 missing from collective #41 (nccl:all_reduce); no dump from rank(s) 2"


def test_an_exception_on_rank_1_of_4_is_the_root_cause_not_rank_0s_timeout(store: Path, tmp_path: Path) -> None:
    user = write_faults(tmp_path / "user")
    job_id = submit(user, "entry=faults:raise_on_rank_1", *FAST, "cluster.collective_timeout_s=10")
    folder = store / job_id
    first, _ = verdict_after(user, folder, job_id, time.time())  # FAILED as soon as rank 1 recorded its error
    assert root_line(first).endswith("ValueError: rank 1 fails on purpose"), first
    wait_for(lambda: (folder / FAILURES / FAILURE.format(rank=0)).is_file(), 60, "rank 0 timed out")
    why = cli(user, "hpcdl.jobs", "why", job_id).stdout
    assert root_line(why).startswith(f"root cause: rank 1 on {HOST} (pid ") and \
        root_line(why).endswith("ValueError: rank 1 fails on purpose"), why
    assert 'faults.py", line 21, in raise_on_rank_1' in why and "hpcdl/" not in why.split("victims")[0], why
    victims = why.split("victims (")[1]
    assert "rank 0 on" in victims and "imed out" in victims, why  # rank 0 waited 10 s for rank 1: a victim
    assert _record_time(folder, 0) - _record_time(folder, 1) > 9  # the victim's failure came later
    shown = cli(user, "hpcdl.jobs", "show", job_id).stdout
    assert f"cause     rank 1 on {HOST}" in shown and "ValueError: rank 1 fails on purpose" in shown, shown
    assert shown.split("--- error ---\n")[1].startswith(f"rank 1 on {HOST}:\nTraceback"), shown


def test_a_rank_killed_with_kill_9_is_named_by_the_launcher(store: Path, tmp_path: Path) -> None:
    user = write_faults(tmp_path / "user")
    job_id = submit(user, "entry=faults:steps_forever", *FAST)
    folder = store / job_id
    wait_for(lambda: heartbeat_of(folder, 2).get("steps", 0) > 2, 120, "rank 2 made steps")
    pid = heartbeat_of(folder, 2)["pid"]
    killed = time.time()
    os.kill(pid, signal.SIGKILL)
    why, ended_s = verdict_after(user, folder, job_id, killed)
    assert root_line(why) == f"root cause: rank 2 on {HOST} (pid {pid}) at " \
        f"{time.strftime('%H:%M:%S', time.localtime(_record_time(folder, 2)))}: Signal: killed by signal SIGKILL", why
    assert _record_time(folder, 2) - killed < 2 and ended_s < 15, (ended_s, why)
    print(f"kill -9: the verdict after {_record_time(folder, 2) - killed:.2f} s, the job ended after {ended_s:.1f} s")


def test_a_rank_sleeping_before_an_all_reduce_is_named_with_its_stack(store: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAULT_NAP_S", "600")
    user = write_faults(tmp_path / "user")
    job_id = submit(user, "entry=faults:steps_forever", *FAST, "cluster.hang_timeout_s=5",
                    "cluster.collective_timeout_s=120", "cluster.export=[FAULT_NAP_S]")
    folder = store / job_id
    why, ended_s = hang_verdict(user, folder, job_id, 2, 5, HOST, 120)
    assert "time.sleep(float(os.environ" in why and "ranks 0,1,3: waiting in all_reduce" in why, why
    assert re.search(r"^flight recorder: rank\(s\) 2 missing from collective #\d+ \(gloo:all_reduce\)$", why, re.M), why
    assert sorted(p.name for p in (folder / STACKS).glob("rank*.json")) == [f"rank{r}.json" for r in range(4)]
    assert ended_s < 5 + 25, (ended_s, why)  # 5 s without a step, a tick, the stacks, the end
    print(f"hang: the verdict and the job's end {ended_s:.1f} s after the nap began (hang_timeout_s=5)")


def test_a_rank_waiting_for_a_message_never_sent_is_named_from_the_flight_recorder(
        store: Path, tmp_path: Path) -> None:
    """Rank 2 waits in a receive from rank 0, which waits with the others in the next all-reduce: every stack is
    in a collective, so the stacks name no outlier; the dumps each rank writes on the hang show rank 2 behind
    the newest all-reduce, and it is the root cause, with its stack, long before the collective timeout."""
    user = write_faults(tmp_path / "user")
    job_id = submit(user, "entry=faults:recv_on_rank_2", *FAST, "cluster.hang_timeout_s=5",
                    "cluster.collective_timeout_s=120")
    folder = store / job_id
    wait_for(lambda: heartbeat_of(folder, 2).get("steps", 0) >= 5, 120, "rank 2 reached its receive")
    why, ended_s = verdict_after(user, folder, job_id, time.time())
    root = root_line(why)
    assert root.startswith(f"root cause: rank 2 on {HOST} (pid ") and \
        "Hang: behind the collective the other ranks wait in (flight recorder)" in root, why
    assert "in wait_for_a_message_never_sent" in why and "OUTLIER rank 2: waiting in recv" in why, why
    assert re.search(r"^flight recorder: rank\(s\) 2 missing from collective #\d+ \(gloo:all_reduce\)$", why, re.M), why
    assert ended_s < 5 + 25, (ended_s, why)


FLIGHT_RECORDED = """
import os, sys, time, torch, torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[2]}", rank=rank, world_size=2)
for _ in range(2):
    dist.all_reduce(torch.ones(4))
if rank == 0:  # enters a third all-reduce that rank 1 never joins
    dist.all_reduce(torch.ones(4), async_op=True)
    time.sleep(0.5)
with open(sys.argv[3], "wb") as dump:
    dump.write(_dump_fr_trace())
sys.stdout.flush()
os._exit(0)
"""


def test_a_flight_recorder_dump_names_the_rank_missing_from_the_collective_when_only_victims_reported(
        tmp_path: Path) -> None:
    """Real dumps of PyTorch's flight recorder (gloo's on the CPU, as NCCL's on a GPU): rank 0 entered collective
    #3, rank 1 never did; the only failure record is rank 0's timeout, a victim. The verdict's root is rank 1."""
    import torch._C._distributed_c10d as c10d

    if not hasattr(c10d, "_dump_fr_trace"):
        pytest.skip(f"torch {torch.__version__} has no flight recorder for gloo")
    folder = tmp_path / "job"
    folder.mkdir(mode=0o700)
    script = tmp_path / "recorded.py"
    script.write_text(FLIGHT_RECORDED)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "2000"}
    ranks = [subprocess.Popen([sys.executable, str(script), str(rank), port, str(folder / f"nccl-trace-rank{rank}")],
                              env=env) for rank in (0, 1)]
    assert [rank.wait(timeout=120) for rank in ranks] == [0, 0]
    failures.record(folder, 0, "DistBackendError", "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3,"
                    " OpType=ALLREDUCE) ran for 600000 milliseconds before timing out", "", run="r", cause=False)
    verdict = judge(folder, 2, "")
    assert verdict.root["rank"] == 1 and verdict.root["cause"], verdict
    assert "missing from collective #3 (gloo:all_reduce) that the other ranks entered" in verdict.root["message"]
    assert [entry["rank"] for entry in verdict.victims] == [0]
    assert "rank(s) 1 missing from collective #3 (gloo:all_reduce)" in verdict.flight, verdict.flight


def test_a_built_in_training_rank_that_hangs_is_diagnosed_before_the_collective_timeout_with_the_defaults(
        store: Path, tmp_path: Path, digits_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """hang_timeout_s left at its default (1800 s): in the built-in trainer a rank the other waits for in a
    collective is hung after 80% of the collective timeout and 20 s under it (40 s here), so the stacks are taken
    and the napping rank named before its peer's all-reduce times out (which would leave only its timeout, a
    victim: the root cause would not be the Hang). Two ranks, the lead napping: the verdict comes
    from where the other waits (DDP's gradient all-reduce), not from which group is bigger. The validation
    after each iteration is no hang."""
    monkeypatch.setenv("FAULT_NAP_S", "600")
    monkeypatch.setenv("FAULT_RANK", "0")
    user = write_faults(tmp_path / "user")
    job_id = submit(user, "training.execution_environment=parallel", "cluster.tasks_per_node=2",
                    "cluster.heartbeat_timeout_s=5", "cluster.time=00:05:00", "cluster.collective_timeout_s=60",
                    "model._target_=faults.NappingNet", f"data.root={digits_root}", "training.max_epochs=50",
                    "training.validation_frequency=1", "cluster.export=[FAULT_NAP_S,FAULT_RANK]")
    folder = store / job_id
    why, ended_s = hang_verdict(user, folder, job_id, 0, 4, HOST, 180)
    assert "rank 1: waiting in backward (DDP's gradient all-reduce)" in why, why
    assert ended_s < 60, (ended_s, why)  # 40 s without a step, a tick, the stacks: before the 60 s timeout
    print(f"trainer hang: the verdict and the job's end {ended_s:.1f} s after the nap began (collective 60 s)")


def test_jobs_stacks_gives_a_running_jobs_stacks_on_demand(store: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAULT_NAP_S", "600")
    user = write_faults(tmp_path / "user")
    job_id = submit(user, "entry=faults:steps_forever", "cluster.tasks_per_node=4", "cluster.time=00:05:00",
                    "cluster.export=[FAULT_NAP_S]")
    folder = store / job_id
    try:
        wait_for(lambda: heartbeat_of(folder, 2).get("steps", 0) >= 5, 120, "rank 2 reached its nap")
        asked = time.monotonic()
        shown = cli(user, "hpcdl.jobs", "stacks", job_id)
        assert shown.returncode == 0 and time.monotonic() - asked < 10, shown
        assert f"job {job_id}: stacks of 4 of 4 rank(s)" in shown.stdout, shown.stdout
        assert "--- ranks 0,1,3 (waiting in all_reduce) ---" in shown.stdout, shown.stdout
        assert "--- OUTLIER rank 2 ---" in shown.stdout and "in nap_before_all_reduce" in shown.stdout, shown.stdout
        assert cli(user, "hpcdl.jobs", "show", job_id).stdout.count("cause ") == 0  # running: no verdict yet
    finally:
        cli(user, "hpcdl.jobs", "cancel", job_id)


def test_a_batch_functions_exception_is_the_root_cause(store: Path, tmp_path: Path) -> None:
    import hpcdl

    job = hpcdl.batch(fail_on_rank_1, "the batch fails on purpose", cluster="local", tasks_per_node=2)
    why, _ = verdict_after(tmp_path, job.folder, job.id, time.time())
    assert root_line(why).startswith(f"root cause: rank 1 on {HOST}") and \
        root_line(why).endswith("RuntimeError: the batch fails on purpose"), why
    assert "in fail_on_rank_1" in why and "raise RuntimeError(message)" in why, why


@pytest.mark.skipif(shutil.which("py-spy") is None, reason="needs py-spy (the test extra installs it)")
def test_jobs_stacks_gives_a_scripts_own_stack_through_py_spy(store: Path, tmp_path: Path) -> None:
    """A script that never reports a step is not taken for a hang (it is watched once it reports one)."""
    user = write_faults(tmp_path / "user")
    submitted = time.monotonic()
    job_id = submit(user, "script=napping_script.py", "cluster.tasks_per_node=2", "cluster.time=00:05:00",
                    "cluster.hang_timeout_s=5")
    folder = store / job_id
    try:
        wait_for(lambda: heartbeat_of(folder, 1).get("ticks", 0) > 1, 120, "rank 1 runs the script")
        shown = cli(user, "hpcdl.jobs", "stacks", job_id)
        assert shown.returncode == 0 and "--- ranks 0,1 ---" in shown.stdout, shown
        assert 'napping_script.py", line 6, in nap' in shown.stdout and "in <module>" in shown.stdout, shown.stdout
        time.sleep(max(0.0, submitted + 20 - time.monotonic()))  # well past hang_timeout_s without a step
        assert "RUNNING" in cli(user, "hpcdl.jobs", "show", job_id).stdout.splitlines()[1]
    finally:
        cli(user, "hpcdl.jobs", "cancel", job_id)


@pytest.mark.skipif(shutil.which("py-spy") is None, reason="needs py-spy (the test extra installs it)")
def test_a_script_rank_sleeping_before_an_all_reduce_is_named_with_its_stack(store: Path, tmp_path: Path) -> None:
    """The script reports its steps with hpcdl.report: rank 1 naps before its sixth all-reduce, rank 0 waits."""
    user = write_faults(tmp_path / "user")
    job_id = submit(user, "script=stepping_script.py", "cluster.tasks_per_node=2", "cluster.time=00:05:00",
                    "cluster.heartbeat_timeout_s=5", "cluster.hang_timeout_s=5", "cluster.collective_timeout_s=90")
    folder = store / job_id
    wait_for(lambda: heartbeat_of(folder, 1).get("steps", 0) >= 5, 120, "rank 1 reached its nap")
    napping = time.time()
    why, ended_s = verdict_after(user, folder, job_id, napping)
    root = root_line(why)
    assert root.startswith(f"root cause: rank 1 on {HOST} (pid ") and "Hang: not in the collective" in root, why
    assert "in nap_before_all_reduce" in why and 'stepping_script.py", line 10, in nap_before_all_reduce' in why, why
    assert "rank 0: waiting in all_reduce" in why and "OUTLIER rank 1" in why, why
    assert ended_s < 5 + 35, (ended_s, why)  # 5 s without a step, a tick, py-spy's stacks, the end
    print(f"script hang: the verdict and the job's end {ended_s:.1f} s after the nap began (hang_timeout_s=5)")


def test_a_scripts_own_traceback_is_the_verdict(store: Path, tmp_path: Path) -> None:
    user = write_faults(tmp_path / "user")
    job_id = submit(user, "script=failing_script.py", "cluster.tasks_per_node=2", "cluster.time=00:05:00",
                    "cluster.collective_timeout_s=10")
    why, _ = verdict_after(user, store / job_id, job_id, time.time())
    assert root_line(why).endswith("ValueError: bad value 7 on purpose") and "rank 1 on" in root_line(why), why
    assert 'failing_script.py", line 8, in check' in why and "ScriptFailed" not in why.split("victims")[0], why
    assert "[rank1]" not in why and "hpcdl/" not in why.split("victims")[0], why


def _mpirun_here(monkeypatch: pytest.MonkeyPatch, *exported: str) -> str:
    """Set MPIRUN_HERE; returns the cluster.export override that passes it and ``exported`` to the job."""
    for name, value in MPIRUN_HERE.items():
        monkeypatch.setenv(name, value)
    return mpirun_export(*exported)


MPI_TRAINER = (*faults.MPI_TRAINER, "cluster.time=00:05:00")


@pytest.mark.mpi
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun")
def test_an_mpi_ranks_exception_is_the_root_cause_with_its_traceback(store: Path, tmp_path: Path,
                                                                     digits_root: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 of an mpirun job raises in its forward pass while rank 0 waits in the mpi4py gradient
    all-reduce (MPI has no timeout of its own): the verdict is rank 1's exception, with its traceback, and
    mpirun's end of rank 0 is no cause."""
    exports = _mpirun_here(monkeypatch, "FAULT_RANK")
    monkeypatch.setenv("FAULT_RANK", "1")
    user = write_faults(tmp_path / "user")
    job_id = submit(user, *MPI_TRAINER, "model._target_=faults.RaisingNet", f"data.root={digits_root}", exports)
    folder = store / job_id
    why, ended_s = verdict_after(user, folder, job_id, time.time(), timeout=240)
    root = root_line(why)
    assert root.startswith("root cause: rank 1 on ") and \
        root.endswith("ValueError: the forward pass fails on purpose"), why
    assert 'faults.py", line' in why and "in fault" in why.split("victims")[0], why
    assert "rank 0" not in root, why
    print(f"mpi exception: the job ended {ended_s:.1f} s after the submission")


@pytest.mark.mpi
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun")
def test_an_mpi_rank_that_hangs_is_named_with_its_stack_while_the_other_waits_in_the_mpi_all_reduce(
        store: Path, tmp_path: Path, digits_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 of an mpirun job naps in its 5th forward pass; MPI's collectives never time out, so only the hang
    watch can end the job: rank 1 is named with its stack, rank 0 waits in the mpi4py Waitall, before the
    shorter hang limit (40 s of a 60 s collective timeout) has passed twice."""
    exports = _mpirun_here(monkeypatch, "FAULT_NAP_S", "FAULT_RANK")
    monkeypatch.setenv("FAULT_NAP_S", "600")
    monkeypatch.setenv("FAULT_RANK", "1")
    user = write_faults(tmp_path / "user")
    job_id = submit(user, *MPI_TRAINER, "model._target_=faults.NappingNet", f"data.root={digits_root}",
                    "cluster.collective_timeout_s=60", exports)
    folder = store / job_id
    why, ended_s = hang_verdict(user, folder, job_id, 1, 4, HOST, 180)
    assert "rank 0: waiting in Waitall (the mpi4py gradient all-reduce)" in why, why
    assert ended_s < 80, (ended_s, why)
    print(f"mpi hang: the verdict and the job's end {ended_s:.1f} s after the nap began (limit 40 s)")


@pytest.mark.mpi
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun")
def test_an_mpirun_that_starts_no_rank_is_told_in_its_own_words(store: Path, tmp_path: Path, digits_root: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """mpirun refuses to start (its remote agent is a path that does not exist): no rank ran, so none recorded a
    failure, and jobs why shows what mpirun said (the job's own stderr), not an empty rank log."""
    exports = _mpirun_here(monkeypatch, "OMPI_MCA_plm_rsh_agent")
    monkeypatch.setenv("OMPI_MCA_plm_rsh_agent", str(tmp_path / "no-such-ssh"))
    job_id = submit(tmp_path, *MPI_TRAINER, f"data.root={digits_root}", exports)
    why, _ = verdict_after(tmp_path, store / job_id, job_id, time.time(), timeout=120)
    assert "mpirun -n 2 exited with code" in why.splitlines()[0], why
    assert "no rank recorded a failure; what the job wrote last:" in why and "plm_rsh_agent" in why and \
        "could not be found" in why, why


@pytest.mark.mpi
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun")
def test_an_mpi_rank_killed_with_kill_9_is_named_from_mpiruns_words(store: Path, tmp_path: Path, digits_root: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _mpirun_here(monkeypatch)
    job_id = submit(tmp_path, *MPI_TRAINER, f"data.root={digits_root}")
    folder = store / job_id
    wait_for(lambda: heartbeat_of(folder, 1).get("steps", 0) > 2, 180, "rank 1 trained")
    pid = heartbeat_of(folder, 1)["pid"]
    killed = time.time()
    os.kill(pid, signal.SIGKILL)
    why, ended_s = verdict_after(tmp_path, folder, job_id, killed)
    assert root_line(why).startswith(f"root cause: rank 1 on ") and f"(pid {pid})" in root_line(why) and \
        "Signal: signal 9 (Killed) (mpirun)" in root_line(why), why
    assert "exited on signal 9" in (folder / LOGS / "stderr.log").read_text()
    print(f"mpi kill -9: the job ended {ended_s:.1f} s after the kill, the verdict is read from mpirun's words")


def test_a_worker_without_load_is_not_taken_for_a_hang(store: Path, tmp_path: Path, digits_root: Path) -> None:
    """Rank 1 (WorkerLoad 0) never steps and waits for the end: no hang, long past hang_startup_s."""
    job_id = submit(tmp_path, "training.execution_environment=parallel", "cluster.tasks_per_node=2",
                    "training.worker_load=[1,0]", f"data.root={digits_root}", "training.max_epochs=1000",
                    "training.verbose=false", "cluster.hang_timeout_s=5", "cluster.hang_startup_s=15",
                    "cluster.time=00:05:00")
    folder = store / job_id
    wait_for(lambda: heartbeat_of(folder, 0).get("steps", 0) > 0, 120, "rank 0 trained")
    time.sleep(25)  # rank 1 has made no step for longer than hang_startup_s
    shown = cli(tmp_path, "hpcdl.jobs", "show", job_id)
    assert "RUNNING" in shown.stdout.splitlines()[1], (shown.stdout, cli(tmp_path, "hpcdl.jobs", "why", job_id).stdout)
    assert cli(tmp_path, "hpcdl.jobs", "cancel", job_id).returncode == 0


LAST_STEP_THEN_SAVING = '''
import time
import hpcdl

for step in range(1, 4):
    hpcdl.report(step, 1.0 / step, total=3)
time.sleep(15)  # saving, after the last step: no step is expected
'''


def test_a_script_past_its_last_reported_step_is_not_taken_for_a_hang(store: Path, tmp_path: Path) -> None:
    (tmp_path / "last_step.py").write_text(LAST_STEP_THEN_SAVING)
    job_id = submit(tmp_path, "script=last_step.py", "cluster.tasks_per_node=2", "cluster.time=00:05:00",
                    "cluster.heartbeat_timeout_s=5", "cluster.hang_timeout_s=5")
    waited = cli(tmp_path, "hpcdl.jobs", "wait", job_id, "--timeout", "200")
    assert waited.stdout.strip() == "COMPLETED", cli(tmp_path, "hpcdl.jobs", "why", job_id).stdout
    assert heartbeat_of(store / job_id, 1)["steps"] == 3  # the script's reports reached its rank's heartbeat


def test_a_doctor_that_times_out_cancels_its_job(store: Path, tmp_path: Path) -> None:
    done = cli(tmp_path, "hpcdl.doctor", "cluster=local", "--timeout", "0.5")
    assert done.returncode == 1 and "error: no report within 0.5 s; job " in done.stderr, (done.stdout, done.stderr)
    assert "cancelled: no allocation is left" in done.stderr, done.stderr
    job_id = re.search(r"^job (\S+): checking", done.stdout, re.M).group(1)
    assert cli(tmp_path, "hpcdl.jobs", "wait", job_id, "--timeout", "30").stdout.strip() == "CANCELLED"
    pid = int(json.loads((store / job_id / MANIFEST).read_text())["backend_id"].split(":")[0])
    wait_for(lambda: not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z",
             30, "the doctor's job process ended")


def test_the_doctor_allocates_with_each_cluster_override_as_the_user_typed_it(store: Path, tmp_path: Path) -> None:
    done = cli(tmp_path, "hpcdl.doctor", "cluster=local", "cluster.mem=16G", "cluster.time=0:10:00",
               "+cluster.env.HPCDL_DOCTOR_MARK=n2:1.0", "--timeout", "120")
    assert done.returncode == 0 and "0 failed check(s) on 1 node(s)" in done.stdout, (done.stdout, done.stderr)
    assert "allreduce skipped  one node" in done.stdout, done.stdout
    job_id = re.search(r"^job (\S+): checking", done.stdout, re.M).group(1)
    profile = json.loads((store / job_id / MANIFEST).read_text())["plan"]["cluster"]
    assert (profile["mem"], profile["time"], profile["env"]["HPCDL_DOCTOR_MARK"]) == ("16G", "0:10:00", "n2:1.0")


def test_the_doctor_says_what_to_change_for_a_failed_check_and_what_to_look_at_for_a_warning(
        capsys: pytest.CaptureFixture[str]) -> None:
    from hpcdl.doctor import print_reports

    low = "all-reduce bus bandwidth 2.10 GB/s, 99% under the expected 400; no node stands out"
    reports = {node: {"seconds": 3.0, "checks": [
        {"name": "data", "status": "failed" if node == "n2" else "passed", "detail": "the data root /x"},
        {"name": "allreduce", "status": "warned", "detail": low}]} for node in ("n1", "n2")}
    assert print_reports(reports) == 1
    said = capsys.readouterr().out
    assert said.count("change: give data.root a path mounted on every node") == 1
    assert said.count("check: check the interconnect and the profile's network settings (cluster.network: "
                      "interfaces, HCAs, GDR level") == 2
    assert "1 failed check(s) on 2 node(s)\n2 warning(s): slow on every node, no node to blame" in said
    del reports["n2"]
    assert print_reports(reports) == 0  # a warning alone: exit 0, said
