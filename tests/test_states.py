"""True states and durable records on the local backend: what `jobs list` shows while a job is being
submitted, from another PID namespace, after a time limit, with damaged files, on a read-only or full
store, and what a killed writer or a deleted job folder leaves behind."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch

import hpcdl
from hpcdl import FolderGoneError, TrainingOptions, train_network
from hpcdl.cluster.local import LocalBackend
from hpcdl.store.atomic import STALE_AFTER_S, remove_stale_temporaries
from hpcdl.store.folders import write_json
from hpcdl.store.status import write_final
from hpcdl.train.checkpoint import load_latest_checkpoint, save_checkpoint
from tests.conftest import job_folders, linear_model
from tests.payloads import add, detach_heartbeat_then_sleep, note_pid_then_sleep

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str, prefix: tuple[str, ...] = (), timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, "-m", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def _row(listing: str, job_id: str) -> list[str]:
    return next(line.split() for line in listing.splitlines() if line.startswith(job_id))


def _until(condition: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what}: not met within {timeout} s")


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _unshare(*flags: str) -> tuple[str, ...]:
    """The unshare prefix for ``flags``; the test is skipped where namespaces are not permitted."""
    try:
        ok = subprocess.run(["unshare", *flags, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        pytest.skip(f"unshare {' '.join(flags)} is not permitted here")
    return ("unshare", *flags)


class SlowBackend:
    """A backend answering ``submit`` only once ``release`` is set: a submission the listing overtakes."""

    def __init__(self, inner: Any, release: threading.Event) -> None:
        self.inner, self.release = inner, release

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def submit(self, plan: Any, folder: Path) -> str:
        self.release.wait(120)
        return self.inner.submit(plan, folder)


@contextlib.contextmanager
def held_submission(store: Path, monkeypatch: pytest.MonkeyPatch, backend: Any,
                    submit: Callable[[], hpcdl.Job]) -> Iterator[tuple[str, list[hpcdl.Job]]]:
    """Run ``submit()`` in a thread whose ``backend`` answers when the block ends; yields the job's id
    once its manifest is written, and a list that holds the Job after the block."""
    release = threading.Event()
    monkeypatch.setattr("hpcdl.lifecycle.submission.backend_for", lambda name: SlowBackend(backend, release))
    submitted: list[hpcdl.Job] = []
    submitter = threading.Thread(target=lambda: submitted.append(submit()))
    submitter.start()
    try:
        yield _until(lambda: [f for f in job_folders(store) if (store / f / "manifest.json").exists()],
                     what="the manifest is written")[0], submitted
    finally:
        release.set()
        submitter.join(120)


def _fake_job(root: Path, job_id: str, backend_id: str | None, host: str, **status: Any) -> Path:
    """A job folder as a submission from ``host`` writes it, with ``status`` as its status.json."""
    folder = root / job_id
    folder.mkdir(parents=True)
    write_json(folder / "manifest.json", {
        "id": job_id, "name": "net", "kind": "function", "profile": "local", "submitted_at": time.time(),
        "plan": {"cluster": {"backend": "local"}}, "submitted_from": {"host": host, "cwd": "/"},
        **({"backend_id": backend_id} if backend_id else {})})
    if status:
        write_json(folder / "status.json", status)
    return folder


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_a_job_being_submitted_is_listed_submitting_never_failed(store: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    submit = lambda: hpcdl.batch(add, 2, 3, cluster="local")  # noqa: E731
    with held_submission(store, monkeypatch, LocalBackend(), submit) as (job_id, submitted):
        listing = _cli("hpcdl.jobs", "list")
        assert listing.returncode == 0 and _row(listing.stdout, job_id)[3] == "SUBMITTING", listing.stdout
        waited = _cli("hpcdl.jobs", "wait", job_id, "--timeout", "1")
        assert waited.returncode == 1 and "still SUBMITTING" in waited.stderr
        assert not (store / job_id / "final.json").exists()
    assert submitted[0].result(timeout=120) == 5
    assert _row(_cli("hpcdl.jobs", "list").stdout, job_id)[3] == "COMPLETED"


def test_a_job_cancelled_while_being_submitted_never_runs(store: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    submit = lambda: hpcdl.batch(note_pid_then_sleep, str(tmp_path), 0, cluster="local")  # noqa: E731
    with held_submission(store, monkeypatch, LocalBackend(), submit) as (job_id, submitted):
        cancelled = _cli("hpcdl.jobs", "cancel", job_id)
        assert cancelled.returncode == 0 and "state now CANCELLED" in cancelled.stdout, cancelled.stderr
    assert submitted[0].wait(timeout=60) == "CANCELLED"
    _until(lambda: not _alive(int(submitted[0].backend_id.split(":")[0])), what="the job's process ends")
    assert not list(tmp_path.glob("pid*")) and _row(_cli("hpcdl.jobs", "list").stdout, job_id)[3] == "CANCELLED"


def test_a_submitter_killed_before_the_backend_answered_leaves_a_failed_job(store: Path) -> None:
    code = ("import threading, hpcdl, hpcdl.lifecycle.submission as s, tests.test_states as t, tests.payloads as p\n"
            "s.backend_for = lambda name: t.SlowBackend(t.LocalBackend(), threading.Event())\n"
            "hpcdl.batch(p.add, 1, 2)\n")
    submitter = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    try:
        job_id = _until(lambda: [f for f in job_folders(store) if (store / f / "manifest.json").exists()],
                        what="the manifest is written")[0]
        assert _row(_cli("hpcdl.jobs", "list").stdout, job_id)[3] == "SUBMITTING"
    finally:
        submitter.kill()
        submitter.wait()
    assert _row(_cli("hpcdl.jobs", "list").stdout, job_id)[3] == "FAILED"
    assert "submission was interrupted" in _cli("hpcdl.jobs", "show", job_id).stdout


def test_a_listing_in_another_pid_namespace_shows_the_last_recorded_state(store: Path, tmp_path: Path) -> None:
    other_host = _unshare("-p", "-f", "--mount-proc")
    job = hpcdl.batch(note_pid_then_sleep, str(tmp_path), 120, cluster="local")
    try:
        _until(lambda: job.refresh().status.get("state") == "RUNNING", what="the job runs")
        listing = _cli("hpcdl.jobs", "list", prefix=other_host)
        assert listing.returncode == 0 and _row(listing.stdout, job.id)[3] == "RUNNING", listing.stdout
        assert "judged only there" in _cli("hpcdl.jobs", "show", job.id, prefix=other_host).stdout
        refused = _cli("hpcdl.jobs", "cancel", job.id, prefix=other_host)
        assert refused.returncode == 1 and "cancel it there" in refused.stderr
        assert not (job.folder / "final.json").exists() and job.state == "RUNNING"
    finally:
        job.cancel()
    assert job.state == "CANCELLED"


def test_ids_without_a_host_key_are_judged_only_on_the_host_that_submitted_them(store: Path) -> None:
    here = _fake_job(store, "old-here", f"{_dead_pid()}:1", socket.gethostname(), state="RUNNING")
    _fake_job(store, "old-there", "1:1", "another-login-node", state="RUNNING")
    listing = _cli("hpcdl.jobs", "list")
    assert listing.returncode == 0
    assert _row(listing.stdout, "old-here")[3] == "FAILED" and _row(listing.stdout, "old-there")[3] == "RUNNING"
    assert json.loads((here / "final.json").read_text())["state"] == "FAILED"
    assert not (store / "old-there" / "final.json").exists()


def test_a_final_state_recorded_by_an_earlier_version_still_holds(store: Path) -> None:
    _fake_job(store, "old-done", f"{_dead_pid()}:1", socket.gethostname(), state="COMPLETED", ended_at=1)
    assert _row(_cli("hpcdl.jobs", "list").stdout, "old-done")[3] == "COMPLETED"
    assert not (store / "old-done" / "final.json").exists()


def test_a_local_time_limit_ends_every_rank_and_the_job_stays_timeout(store: Path, tmp_path: Path) -> None:
    job = hpcdl.batch(note_pid_then_sleep, str(tmp_path), 60, cluster="local", tasks_per_node=2, time="0:10")
    pids = _until(lambda: [int(p.read_text()) for p in sorted(tmp_path.glob("pid*"))
                           if p.read_text()] if len(list(tmp_path.glob("pid*"))) == 2 else None,
                  what="both ranks start")
    assert job.wait(timeout=60) == "TIMEOUT"
    _until(lambda: not any(map(_alive, pids)), timeout=5, what="both ranks are ended")
    assert _row(_cli("hpcdl.jobs", "list").stdout, job.id)[3] == "TIMEOUT"
    assert json.loads((job.folder / "final.json").read_text())["state"] == "TIMEOUT"
    assert not list(tmp_path.glob("finished*"))


def test_cancel_ends_every_rank_of_a_local_job(store: Path, tmp_path: Path) -> None:
    job = hpcdl.batch(note_pid_then_sleep, str(tmp_path), 120, cluster="local", tasks_per_node=2)
    pids = _until(lambda: [int(p.read_text()) for p in sorted(tmp_path.glob("pid*"))
                           if p.read_text()] if len(list(tmp_path.glob("pid*"))) == 2 else None,
                  what="both ranks start")
    cancelled = _cli("hpcdl.jobs", "cancel", job.id)
    assert cancelled.stdout.strip().endswith("state now CANCELLED"), cancelled.stderr
    _until(lambda: not any(map(_alive, pids)), timeout=15, what="both ranks are ended")
    assert job.state == "CANCELLED"


@pytest.mark.parametrize("ending", ["cancel", "time limit"])
def test_a_child_the_job_detached_ends_with_the_job(store: Path, tmp_path: Path, ending: str) -> None:
    job = hpcdl.batch(detach_heartbeat_then_sleep, str(tmp_path), 120, cluster="local",
                      **({"time": "0:10"} if ending == "time limit" else {}))
    pid = int(_until(lambda: (tmp_path / "detached").is_file() and (tmp_path / "detached").read_text(),
                     what="the detached child starts"))
    _until(lambda: (tmp_path / "heartbeat").is_file(), what="the heartbeat starts")
    assert os.getsid(pid) == pid, "the child left the job's session"
    if ending == "cancel":
        assert _cli("hpcdl.jobs", "cancel", job.id).stdout.strip().endswith("state now CANCELLED")
    assert job.wait(timeout=60) == ("CANCELLED" if ending == "cancel" else "TIMEOUT")
    _until(lambda: not _alive(pid), timeout=15, what="the detached child is ended")
    last = (tmp_path / "heartbeat").read_text()
    time.sleep(0.5)
    assert (tmp_path / "heartbeat").read_text() == last, "the heartbeat goes on"


def _race(folder: str, state: str, start: Any, results: Any) -> None:
    start.wait()
    results.put((state, write_final(Path(folder), state)))


def test_of_racing_final_states_exactly_the_first_holds(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    start, results = context.Event(), context.Queue()
    writers = [context.Process(target=_race, args=(str(tmp_path), f"STATE{i}", start, results)) for i in range(8)]
    for writer in writers:
        writer.start()
    start.set()
    outcomes = dict(results.get(timeout=60) for _ in writers)
    for writer in writers:
        writer.join(60)
    winners = [state for state, won in outcomes.items() if won]
    assert len(winners) == 1
    assert json.loads((tmp_path / "final.json").read_text())["state"] == winners[0]
    assert [p.name for p in tmp_path.iterdir()] == ["final.json"]  # no temporary file left


GOOD = json.dumps({"id": "b-bad", "name": "net", "kind": "function", "profile": "local", "submitted_at": 1,
                   "plan": {"cluster": {"backend": "local"}}})
DAMAGE = {"garbage": b"\x13 not json {", "empty": b"", "non-utf8": b'{"id": "\xff\xfe"}',
          "truncated": GOOD[: len(GOOD) // 2].encode(), "not-an-object": b"[1, 2]"}
CASES = [(file, damage) for file in ("manifest.json", "status.json", "final.json") for damage in DAMAGE]
MANIFEST_DAMAGE = {"fields missing": b'{"id": "b-bad", "name": 5}',
                   "wrong types": GOOD.replace('"submitted_at": 1', '"submitted_at": "yesterday"').encode()}
CASES += [("manifest.json", damage) for damage in MANIFEST_DAMAGE]


@pytest.mark.parametrize(("file", "damage"), CASES)
def test_a_damaged_record_is_listed_as_damaged_and_the_others_still_are(store: Path, file: str,
                                                                         damage: str) -> None:
    _fake_job(store, "a-good", "1:1@elsewhere", "elsewhere", state="RUNNING", started_at=0)
    write_json(store / "a-good" / "final.json", {"state": "COMPLETED", "ended_at": 60})
    bad = _fake_job(store, "b-bad", "1:1@elsewhere", "elsewhere", state="RUNNING")
    (bad / file).write_bytes({**DAMAGE, **MANIFEST_DAMAGE}[damage])
    listing = _cli("hpcdl.jobs", "list")
    assert listing.returncode == 0 and "Traceback" not in listing.stderr, listing.stderr
    assert _row(listing.stdout, "a-good")[3] == "COMPLETED"
    assert "DAMAGED" in _row(listing.stdout, "b-bad"), listing.stdout
    assert "job b-bad is DAMAGED" in listing.stderr and file in listing.stderr
    shown = _cli("hpcdl.jobs", "show", "b-bad")
    assert shown.returncode == 1 and "DAMAGED" in shown.stdout and "Traceback" not in shown.stderr


@pytest.mark.parametrize(("file", "content", "reason"), [
    ("status.json", {"state": "RUNNING", "events": 5}, "TypeError: 'int' object is not iterable"),
    ("status.json", {"state": "RUNNING", "events": [{"at": 1}]}, "KeyError: 'event'"),
    ("manifest.json", None, "TypeError: string indices must be integers"),
])
def test_show_of_a_record_of_the_wrong_shape_says_damaged_with_the_reason(store: Path, file: str, content: Any,
                                                                          reason: str) -> None:
    bad = _fake_job(store, "b-bad", "1:1@elsewhere", "elsewhere", state="RUNNING")
    if content is None:  # valid JSON, a field of the wrong type
        manifest = json.loads((bad / file).read_text())
        content = {**manifest, "submitted_from": "elsewhere"}
    write_json(bad / file, content)
    shown = _cli("hpcdl.jobs", "show", "b-bad")
    assert shown.returncode == 1 and "Traceback" not in shown.stderr, shown.stderr
    job, state, folder = shown.stdout.splitlines()  # nothing of the half-composed text
    assert job == "job       b-bad" and folder == f"folder    {bad}"
    assert state.startswith(f"state     DAMAGED  (unexpected content: {reason}"), state


def test_a_fifo_named_status_json_is_damaged_not_a_regular_file_and_never_blocks(store: Path) -> None:
    bad = _fake_job(store, "b-bad", "1:1@elsewhere", "elsewhere")
    os.mkfifo(bad / "status.json", 0o600)
    listing = _cli("hpcdl.jobs", "list", timeout=30)
    assert listing.returncode == 0 and "DAMAGED" in _row(listing.stdout, "b-bad"), listing.stdout
    assert "status.json: is not a regular file" in listing.stderr and "not yours alone" not in listing.stderr
    shown = _cli("hpcdl.jobs", "show", "b-bad", timeout=30)
    assert shown.returncode == 1 and "DAMAGED" in shown.stdout and "status.json: is not a regular file" in shown.stdout


def test_a_parent_folder_swapped_by_a_co_user_never_shows_a_false_failed_or_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parent = tmp_path / "lab"
    store = parent / "store"
    monkeypatch.setenv("HPCDL_STORE", str(store))
    monkeypatch.setenv("HOME", str(tmp_path))
    completed = hpcdl.batch(add, 1, 2, cluster="local")
    assert completed.result(timeout=120) == 3
    stop = threading.Event()

    def racer() -> None:  # the co-user: the parent renamed away and back, or swapped for a link to itself
        aside = tmp_path / "lab.aside"
        while not stop.is_set():
            os.rename(parent, aside)
            time.sleep(0.001)
            os.symlink(aside, parent)
            time.sleep(0.001)
            os.unlink(parent)
            os.rename(aside, parent)
            time.sleep(0.003)

    thread = threading.Thread(target=racer)
    thread.start()
    try:
        outputs = [_cli("hpcdl.jobs", verb, completed.id if verb == "show" else "--points", timeout=60)
                   for _ in range(10) for verb in ("list", "show")]
    finally:
        stop.set()
        thread.join()
    for done in outputs:
        assert "Traceback" not in done.stderr, done.stderr
        assert "FAILED" not in done.stdout and "without a result" not in done.stdout, done.stdout
    assert any(completed.id in done.stdout for done in outputs)
    assert json.loads((completed.folder / "final.json").read_text())["state"] == "COMPLETED"
    assert _row(_cli("hpcdl.jobs", "list").stdout, completed.id)[3] == "COMPLETED"


def _read_only(store: Path) -> tuple[str, ...]:
    """Run a command with ``store`` read-only (a bind mount in a mount namespace of its own)."""
    prefix = _unshare("-m")
    quoted = shlex.quote(str(store))
    return (*prefix, "sh", "-c", f"mount --bind {quoted} {quoted} && mount -o remount,ro,bind {quoted} {quoted} "
            f'&& exec "$@"', "sh")


def test_a_read_only_store_is_listed_and_refuses_submissions_cleanly(store: Path) -> None:
    from hpcdl.host import host_key

    _fake_job(store, "ended", f"{_dead_pid()}:1@{host_key()}", socket.gethostname(), state="RUNNING")
    read_only = _read_only(store)
    listing = _cli("hpcdl.jobs", "list", prefix=read_only)
    assert listing.returncode == 0 and "Traceback" not in listing.stderr, listing.stderr
    assert _row(listing.stdout, "ended")[3] == "FAILED"
    assert not (store / "ended" / "final.json").exists()  # shown, not recorded: the store is read-only
    submitted = _cli("hpcdl.submit", prefix=read_only)
    assert submitted.returncode == 2 and "Traceback" not in submitted.stderr, submitted.stderr
    assert submitted.stderr.startswith(f"error: cannot write the job store {store}: Read-only file system")
    assert job_folders(store) == ["ended"]


def test_a_full_store_refuses_submissions_and_leaves_no_folder(store: Path) -> None:
    prefix = _unshare("-m")
    store.mkdir()
    quoted = shlex.quote(str(store))
    script = (f"mount -t tmpfs -o size=64k,mode=0700 tmpfs {quoted} && (head -c 1M /dev/zero > {quoted}/filler 2>/dev/null; true) && "
              f"{shlex.quote(sys.executable)} -m hpcdl.submit; echo \"exit $?\"; ls -A {quoted}")
    done = subprocess.run([*prefix, "sh", "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.stdout.splitlines() == ["exit 2", "filler"], done.stdout + done.stderr
    assert done.stderr.startswith(f"error: cannot write the job store {store}: No space left on device")
    assert "Traceback" not in done.stderr


def test_a_killed_checkpoint_writers_temporary_file_is_removed_by_the_next_save(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    code = ("import sys, time; from hpcdl.store.atomic import atomic_save\n"
            "atomic_save(sys.argv[1], lambda f: (f.write(b'partial'), f.flush(), time.sleep(600)))")
    writer = subprocess.Popen([sys.executable, "-c", code, str(folder / "checkpoint-000000001.pt")], cwd=ROOT)
    try:
        temporary = _until(lambda: [p for p in folder.iterdir() if p.name.endswith(".tmp")], what="it writes")[0]
        assert remove_stale_temporaries(folder) == []  # its writer still runs
    finally:
        writer.kill()
        writer.wait()
    foreign = folder / ".checkpoint-000000003.pt.0badc0de.1.0123abcd.tmp"  # another host's, being written
    old = folder / ".checkpoint-000000004.pt.0badc0de.1.89abcdef.tmp"
    for path in (foreign, old):
        path.write_bytes(b"partial")
    os.utime(old, (time.time() - STALE_AFTER_S - 60,) * 2)
    save_checkpoint(folder, 2, {"w": torch.ones(2)})
    assert not temporary.exists() and not old.exists() and foreign.exists()
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == [
        "checkpoint-000000002.pt", "checkpoint-000000002.sha256"]
    assert load_latest_checkpoint(folder)["w"].tolist() == [1.0, 1.0]


def test_a_job_folder_deleted_mid_training_is_not_made_again(tmp_path: Path, blobs,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    folder = tmp_path / "job"
    folder.mkdir()
    monkeypatch.setenv("HPCDL_JOB_FOLDER", str(folder))  # as the worker sets it for the ranks
    options = TrainingOptions(max_epochs=4, mini_batch_size=16, verbose=False, execution_environment="cpu",
                              output_dir=str(folder), checkpoint_path=str(folder / "checkpoints"),
                              checkpoint_frequency=2, checkpoint_frequency_unit="iteration")
    delete_at_3 = lambda record: record["iteration"] == 3 and shutil.rmtree(folder)  # noqa: E731
    with pytest.raises(FolderGoneError, match="deleted"):
        train_network(blobs, linear_model(), options, callbacks=[delete_at_3])
    assert not folder.exists()
    with pytest.raises(FolderGoneError, match="is gone"):
        save_checkpoint(folder / "checkpoints", 4, {"w": torch.ones(1)})
    assert not folder.exists()


def test_only_an_earlier_runs_failure_of_the_same_slurm_job_is_withdrawn_by_a_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcdl.cluster import backend_for
    from hpcdl.distributed.restarts import record_failure, withdraw_earlier_failure

    slurm = backend_for("slurm")  # its answers come from the job's environment and scontrol

    monkeypatch.setenv("PATH", "/nonexistent")  # no scontrol: the job cannot be seen queued again
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    assert record_failure(tmp_path, slurm, "rank 1: lost its peer", rank=1)
    assert not record_failure(tmp_path, slurm, "rank 0: a second failure")  # the first holds
    assert withdraw_earlier_failure(tmp_path, slurm) is None  # this run's own failure stays
    monkeypatch.setenv("SLURM_JOB_ID", "78")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert withdraw_earlier_failure(tmp_path, slurm) is None  # another Slurm job's (after jobs resume) stays
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    withdrawn = withdraw_earlier_failure(tmp_path, slurm)  # the restarted run of job 77
    assert withdrawn is not None and withdrawn["reason"] == "rank 1: lost its peer"
    assert not (tmp_path / "final.json").exists()
    write_final(tmp_path, "CANCELLED", reason="cancelled with hpcdl")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    assert withdraw_earlier_failure(tmp_path, slurm) is None  # a cancel is never undone
    (tmp_path / "final.json").write_text("{damaged")  # a final state all the same: kept, never replaced
    assert not record_failure(tmp_path, slurm, "rank 0: fails") and withdraw_earlier_failure(tmp_path, slurm) is None
    assert (tmp_path / "final.json").read_text() == "{damaged"


@pytest.mark.parametrize(("own", "slurm", "listed", "reason"), [
    ("RUNNING", "PENDING", "PENDING", "queued again: it goes on from its newest checkpoint"),
    ("REQUEUED", "REQUEUE_HOLD", "REQUEUE_HOLD", "queued again: it goes on from its newest checkpoint"),
    ("RUNNING", "RUNNING", "RUNNING", ""),
    (None, "PENDING", "PENDING", ""),  # not started yet
])
def test_a_job_that_ran_and_is_queued_again_is_listed_so(tmp_path: Path, own: str | None, slurm: str,
                                                         listed: str, reason: str) -> None:
    from hpcdl.store.folders import JobRecord
    from hpcdl.lifecycle.states import _resolve

    record = JobRecord(tmp_path, {"plan": {"cluster": {"backend": "slurm"}}}, {"state": own} if own else {})
    _resolve(record, slurm)
    assert (record.state, record.reason) == (listed, reason)
