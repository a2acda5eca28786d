"""Batch jobs on the embedded default profile (cluster=local): detached processes on this machine."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hpcdl
from hpcdl import JobFailedError
from tests.conftest import job_folders
from tests.test_states import _row


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, check=check, timeout=300)


def add(a: int, b: int) -> int:
    return a + b


def sleep_then_fail(seconds: float) -> None:
    time.sleep(seconds)
    raise RuntimeError("the network diverged")


def test_training_job_outlives_the_submitting_process_and_is_fetched_later(store: Path, digits_root: Path,
                                                                           tmp_path: Path) -> None:
    submitted = _cli("hpcdl.submit", f"data.root={digits_root}", "training.max_epochs=2", "name=digits")
    assert "Submitted job" in submitted.stdout and "python -m hpcdl.jobs fetch" in submitted.stdout
    job_id = submitted.stdout.split()[2]  # the submitting process has exited; the job runs on
    assert _cli("hpcdl.jobs", "wait", job_id, "--timeout", "240").stdout.strip() == "COMPLETED"
    listing = _cli("hpcdl.jobs", "list").stdout
    assert job_id in listing and "COMPLETED" in listing and "100%" in listing
    fetched = _cli("hpcdl.jobs", "fetch", job_id, "--to", str(tmp_path / "got"))
    assert "stop_reason:         max-epochs" in fetched.stdout
    for name in ("model.pt", "info.json", "result.json", "metrics.jsonl", "training-progress.png"):
        assert (tmp_path / "got" / name).is_file()
    shown = _cli("hpcdl.jobs", "show", job_id).stdout
    assert "state     COMPLETED" in shown and "training.max_epochs=2" in shown
    assert re.search(r"^progress  epoch 2 of 2, iteration (\d+) of \1 \(100%\); loss \d\.\d{4}", shown, re.M), shown
    assert re.search(r"^result    max-epochs after \d+ iterations, final loss \d\.\d{4}, validation accuracy", shown,
                     re.M), shown
    assert f"model.pt, info.json, result.json, metrics.jsonl, training-progress.png in {store / job_id}" in shown
    assert "--- error ---" not in shown and "{" not in shown  # no raw JSON, no error section
    scheduler_id = _row(listing, job_id)[-1]
    assert re.fullmatch(r"\d+@[^/]+", scheduler_id), scheduler_id  # PID@HOST: no boot id, no namespace
    assert "Training finished: max-epochs" in _cli("hpcdl.jobs", "logs", job_id).stdout


def test_batch_function_result_comes_back_in_a_new_process(store: Path) -> None:
    job = hpcdl.batch(add, 2, 40, cluster="local")
    code = f"import hpcdl.lifecycle.job as j; print(j.Job.attach({job.id!r}).result(timeout=120))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "42"
    assert job.state == "COMPLETED"


def note_rank(folder: str) -> str:
    import os
    import time

    rank, world = os.environ["RANK"], os.environ["WORLD_SIZE"]
    time.sleep(2.0 * int(rank))  # the job is done when the last rank is, not when rank 0 is
    Path(folder, f"rank{rank}").write_text(world)
    return f"rank {rank} of {world}"


def test_batch_with_two_tasks_runs_the_function_on_every_rank(store: Path, tmp_path: Path) -> None:
    job = hpcdl.batch(note_rank, str(tmp_path), cluster="local", tasks_per_node=2)
    assert job.result(timeout=120) == "rank 0 of 2"
    assert sorted(p.name for p in tmp_path.glob("rank*")) == ["rank0", "rank1"]
    assert (tmp_path / "rank1").read_text() == "2"


def test_batch_with_all_ranks_returns_every_ranks_value_in_rank_order(store: Path, tmp_path: Path) -> None:
    job = hpcdl.batch(note_rank, str(tmp_path), cluster="local", tasks_per_node=2, all_ranks=True)
    assert job.result(timeout=120) == ["rank 0 of 2", "rank 1 of 2"]


def test_failing_job_shows_failed_with_its_traceback(store: Path) -> None:
    job = hpcdl.batch(sleep_then_fail, 0.1, cluster="local")
    assert job.wait(timeout=120) == "FAILED"
    with pytest.raises(JobFailedError, match="the network diverged"):
        job.result()
    shown = _cli("hpcdl.jobs", "show", job.id).stdout
    assert "state     FAILED" in shown and "RuntimeError: the network diverged" in shown
    assert "Traceback (most recent call last)" in shown


def test_cancel_ends_a_running_local_job(store: Path) -> None:
    job = hpcdl.batch(time.sleep, 300, cluster="local")
    deadline = time.monotonic() + 60
    while job.refresh().status.get("state") != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _cli("hpcdl.jobs", "cancel", job.id).stdout.strip().endswith("state now CANCELLED")
    shown = _cli("hpcdl.jobs", "show", job.id).stdout
    assert "state     CANCELLED  (cancelled with hpcdl)" in shown and "error" not in shown, shown
    pid = int(job.backend_id.split(":")[0])
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]


def test_cancel_of_a_job_that_ended_says_so_and_keeps_its_state(store: Path) -> None:
    job = hpcdl.batch(add, 1, 2, cluster="local")
    assert job.wait(timeout=120) == "COMPLETED"
    cancelled = _cli("hpcdl.jobs", "cancel", job.id)
    assert (cancelled.returncode, cancelled.stdout) == (0, f"{job.id} had already ended COMPLETED: nothing to cancel\n")
    assert job.refresh().state == "COMPLETED" and job.result() == 3


def test_logs_and_listings_say_why_there_is_nothing_to_show(store: Path) -> None:
    job = hpcdl.batch(add, 2, 40, cluster="local")
    assert job.wait(timeout=120) == "COMPLETED"
    missing_rank = _cli("hpcdl.jobs", "logs", job.id, "--rank", "5", check=False)
    assert missing_rank.returncode == 1 and missing_rank.stdout == ""  # it printed rank 0's log
    assert f"job {job.id} has 1 rank(s), numbered 0 to 0: there is no rank 5" in missing_rank.stderr
    empty = _cli("hpcdl.jobs", "logs", job.id)
    assert empty.stdout == "" and f"rank 0 of job {job.id} (COMPLETED) has written nothing to its stdout" in empty.stderr
    unknown = _cli("hpcdl.jobs", "list", "--state", "done", check=False)
    assert unknown.returncode == 2 and "no state 'done': one of SUBMITTING, PENDING, RUNNING, COMPLETED" in unknown.stderr
    assert _row(_cli("hpcdl.jobs", "list", "--state", "completed").stdout, job.id)[3] == "COMPLETED"


def test_job_killed_without_a_result_is_failed_not_running(store: Path) -> None:
    import os
    import signal

    job = hpcdl.batch(os.kill, 0, signal.SIGKILL, cluster="local")  # pid 0: its own process group
    assert job.wait(timeout=60) == "FAILED"
    assert "ended without a result" in job.refresh().reason


def test_local_job_past_its_time_limit_ends_as_timeout(store: Path) -> None:
    job = hpcdl.batch(time.sleep, 120, cluster="local", time="0:02")
    assert job.wait(timeout=60) == "TIMEOUT"
    assert "time limit 0:02 reached" in job.refresh().reason
    shown = _cli("hpcdl.jobs", "show", job.id).stdout
    assert "state     TIMEOUT" in shown and "--- error ---" not in shown, shown  # it was an empty error section


def test_bad_submission_leaves_nothing_behind(store: Path) -> None:
    for bad in (["cluster=nowhere"], ["cluster.time=forever"], ["training.mini_batch_size=0"],
                ["cluster.python=/missing/python3"]):
        done = _cli("hpcdl.submit", *bad, check=False)
        assert done.returncode == 2 and done.stderr.startswith("error: "), bad
    assert job_folders(store) == []


def test_dry_run_prints_the_command_and_submits_nothing(store: Path) -> None:
    done = _cli("hpcdl.submit", "dry_run=true")
    assert "-m hpcdl.worker" in done.stdout and "dry run: nothing was submitted" in done.stdout
    assert job_folders(store) == []


@pytest.mark.parametrize("epochs_written", [3, 21])  # the second writes more than 64 KB (the tail once read)
def test_progress_counts_the_iterations_of_an_epoch_in_a_long_metrics_file(tmp_path: Path,
                                                                         epochs_written: int) -> None:
    import json

    from hpcdl.store.metrics import progress
    from hpcdl.store.folders import JobRecord

    per_epoch, last = 45, epochs_written * 45 - 5
    lines = [json.dumps({"kind": "iteration", "epoch": (i - 1) // per_epoch + 1, "iteration": i, "loss": 0.1,
                         "accuracy": 1.0, "time_s": 0.5 * i, "padding": "x" * 40}) for i in range(1, last + 1)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    record = JobRecord(tmp_path, {"plan": {"config": {"training": {"max_epochs": 60}}}}, {}, state="RUNNING")
    view = progress(record)
    assert view["iteration"] == last and view["epoch"] == epochs_written
    assert view["fraction"] == last / (per_epoch * 60)


def _finished_training_job(store: Path, name: str) -> Path:
    from hpcdl.store.folders import write_json

    folder = store / f"261203-120000-{len(job_folders(store)):04x}"
    folder.mkdir(parents=True, mode=0o700)
    write_json(folder / "manifest.json", {"id": folder.name, "name": name, "kind": "train", "profile": "local",
                                          "submitted_at": time.time(), "backend_id": "1:0",
                                          "plan": {"cluster": {"backend": "local"},
                                                   "config": {"training": {"max_epochs": 30}}}})
    write_json(folder / "final.json", {"state": "COMPLETED", "started_at": 0, "ended_at": 60})
    return folder


def _metrics_of_an_early_best(count: int = 3000) -> list[dict]:
    """A validation of 0.999 first, then more than 64 KB of iterations and validations of 0.80."""
    records = [{"kind": "validation", "epoch": 1, "iteration": 1, "loss": 0.01, "accuracy": 0.999}]
    for i in range(2, count):
        records.append({"kind": "iteration", "epoch": 1 + i // 100, "iteration": i, "loss": 0.5, "accuracy": 0.8,
                        "learn_rate": 0.01, "time_s": 0.1 * i})
        if i % 100 == 0:
            records.append({"kind": "validation", "epoch": i // 100, "iteration": i, "loss": 0.6, "accuracy": 0.8})
    return records


def test_best_validation_listed_is_the_runs_best_however_long_its_metrics(store: Path) -> None:
    import json

    from hpcdl.store.folders import load_record
    from hpcdl.lifecycle.sweep_report import summary

    folder = _finished_training_job(store, "early-best")
    text = "".join(json.dumps(r) + "\n" for r in _metrics_of_an_early_best())
    assert len(text) > 4 * 65536
    (folder / "metrics.jsonl").write_text(text)  # as a job of an earlier version left it: no summary
    listing = _cli("hpcdl.jobs", "list").stdout
    assert "99.90%" in listing and "80.00%" not in listing
    point = load_record(folder)
    point.manifest["sweep"] = {"id": "x", "num": 0}  # the sweep's table and CSV rows come from the same view
    assert summary([point])[0]["best_validation_accuracy"] == 0.999


def test_a_run_keeps_its_metrics_summary_as_it_writes(store: Path) -> None:
    from hpcdl.store.metrics import MetricsLog

    folder = _finished_training_job(store, "summarised")
    log = MetricsLog(folder)
    for record in _metrics_of_an_early_best():
        log.write(record)
    summary = (folder / "metrics-summary.json").read_bytes()
    log.close()  # within SUMMARY_INTERVAL_S of the start: saved at the start and once more here, not per record
    assert (folder / "metrics-summary.json").read_bytes() != summary
    metrics = folder / "metrics.jsonl"
    data = metrics.read_bytes()
    metrics.write_bytes(b" " * data.index(b"\n") + data[data.index(b"\n"):])  # the first record blanked
    listing = _cli("hpcdl.jobs", "list").stdout
    assert "99.90%" in listing, "the listing re-read the metrics instead of the run's summary"


def test_user_code_reporting_epochs_from_zero_and_its_own_numbers_is_listed(store: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcdl import reporting

    folder = _finished_training_job(store, "from-zero")
    monkeypatch.setenv("HPCDL_JOB_FOLDER", str(folder))
    monkeypatch.setenv("RANK", "0")
    for step in range(1, 7):  # epochs 0, 0, 0, 1, 1, 1: the summary's per-epoch count divided by zero here
        reporting.report(step, 1.0 / step, epoch=(step - 1) // 3, total=6, tokens_per_s=100.0 * step)
    reporting.close_metrics()
    listing = _cli("hpcdl.jobs", "list")
    assert listing.returncode == 0 and "from-zero" in listing.stdout, listing.stderr


def test_user_code_may_report_numpy_and_torch_integers_and_not_a_name_of_the_record(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy
    import torch

    from hpcdl import reporting
    from hpcdl.store.metrics import read_metrics

    folder = _finished_training_job(store, "numpy-ints")
    monkeypatch.setenv("HPCDL_JOB_FOLDER", str(folder))
    monkeypatch.setenv("RANK", "0")
    before = len(read_metrics(folder))
    reporting.report(numpy.int64(1), torch.tensor(0.5), epoch=numpy.int32(0), total=torch.tensor(2), lr=numpy.float32(1))
    reporting.report_validation(torch.tensor(1), numpy.float64(0.25), epoch=torch.tensor(0))
    with pytest.raises(ValueError, match="kind is a name of hpcdl's own record"):
        reporting.report(2, 0.4, kind=1.0)
    reporting.close_metrics()
    records = read_metrics(folder)[before:]
    assert [(r["kind"], r["iteration"], r["epoch"], r.get("total")) for r in records] == [
        ("iteration", 1, 0, 2), ("validation", 1, 0, None)]


def test_a_rank_done_in_a_run_slurm_ended_does_not_complete_the_next_run(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from hpcdl.cluster import backend_for
    from hpcdl.distributed.env import LAUNCHER_RANK_VARIABLES
    from hpcdl.worker import _all_ranks_done

    plan = SimpleNamespace(world_size=2)
    for name in LAUNCHER_RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)

    def returns(rank: int, run: int) -> bool:
        monkeypatch.setenv("SLURM_PROCID", str(rank))
        monkeypatch.setenv("SLURM_RESTART_COUNT", str(run))
        return _all_ranks_done(tmp_path, plan, backend_for("slurm"))

    assert not returns(1, run=0)  # rank 1 finished, then Slurm ended the run (its node failed) and requeued it
    assert not returns(0, run=1)  # the next run: rank 1's earlier mark does not count
    assert returns(1, run=1)
