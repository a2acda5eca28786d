"""Your own entry function or training script as a job on the local profile: on every rank, with torchrun's
variables, its hpcdl.report records in watch, list and the plot, its result and results folder fetched."""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import job_folders
from tests.user_code import write_user_code


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def _submit(cwd: Path, *args: str) -> str:
    done = _cli(cwd, "hpcdl.submit", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[2]


def test_a_torchrun_style_script_runs_on_two_ranks_with_its_arguments(store: Path, tmp_path: Path) -> None:
    user = write_user_code(tmp_path / "user")
    job_id = _submit(user, "script=train_ddp.py", "cluster.tasks_per_node=2", "name=ddp-script",
                     "--", "--steps", "4", "--lr", "0.05")
    assert _cli(user, "hpcdl.jobs", "wait", job_id, "--timeout", "240").stdout.strip() == "COMPLETED", \
        _cli(user, "hpcdl.jobs", "show", job_id).stdout
    for rank in (0, 1):  # each rank's output on its own
        logs = _cli(user, "hpcdl.jobs", "logs", job_id, "--rank", str(rank)).stdout
        assert f"script rank {rank} of 2 local {rank}: sum 3 lr 0.05" in logs, logs
        assert f"script rank {1 - rank} of 2" not in logs, logs
    watched = _cli(user, "hpcdl.jobs", "watch", job_id).stdout
    assert "step 4/4 loss" in watched and "COMPLETED" in watched and "epoch" not in watched
    listing = _cli(user, "hpcdl.jobs", "list").stdout
    assert "ddp-script" in listing and "100%" in listing
    got = tmp_path / "got"
    fetched = _cli(user, "hpcdl.jobs", "fetch", job_id, "--to", str(got))
    assert "'world': 2" in fetched.stdout, fetched.stderr
    assert (got / "results" / "rank0.txt").read_text() == "3" and (got / "results" / "rank1.txt").is_file()
    assert (got / "training-progress.png").stat().st_size > 1000 and (got / "metrics.jsonl").is_file()


def test_an_entry_gets_the_config_on_every_rank(store: Path, tmp_path: Path) -> None:
    import hpcdl

    user = write_user_code(tmp_path / "user")
    job_id = _submit(user, "entry=myentry:main", "cluster.tasks_per_node=2", "name=my-entry")
    job = hpcdl.Job.attach(job_id)
    assert job.result(timeout=240) == {"name": "my-entry", "rank": 0, "world": 2}


def test_a_failing_script_fails_the_job_naming_its_rank(store: Path, tmp_path: Path) -> None:
    import hpcdl

    user = write_user_code(tmp_path / "user")
    (user / "broken.py").write_text("import os, sys\nsys.exit(3 if os.environ['RANK'] == '1' else 0)\n")
    job = hpcdl.Job.attach(_submit(user, "script=broken.py", "cluster.tasks_per_node=2"))
    assert job.wait(timeout=240) == "FAILED"
    assert "rank 1: broken.py exited with code 3" in job.refresh().reason


PLAIN_SCRIPT = """
import argparse, os
import hpcdl
from helper import message  # a sibling module of the code copy

parser = argparse.ArgumentParser()
parser.add_argument("--output-dir", default="out")
args = parser.parse_args()
os.makedirs(args.output_dir, exist_ok=True)
with open(os.path.join(args.output_dir, "weights.txt"), "w") as f:
    f.write(message())
for step in range(1, 4):
    hpcdl.report(step=step, total=3, loss=1.0 / step, lr=0.1 * step)
"""


def test_a_plain_script_waited_for_exits_0_and_its_relative_outputs_come_back(store: Path, tmp_path: Path) -> None:
    user = write_user_code(tmp_path / "user")
    (user / "helper.py").write_text("def message():\n    return 'from the sibling module'\n")
    (user / "plain.py").write_text(PLAIN_SCRIPT)
    done = _cli(user, "hpcdl.submit", "script=plain.py", "wait=true", "--", "--output-dir", "out")
    assert done.returncode == 0, done.stderr
    assert "step 3/3 loss 0.3333 lr 0.3" in done.stdout and "epoch" not in done.stdout
    assert done.stdout.rstrip().endswith("result: None")  # it saved none
    job_id = done.stdout.split()[2]
    assert not (store / job_id / "code" / "out").exists()
    got = tmp_path / "got"
    assert _cli(user, "hpcdl.jobs", "fetch", job_id, "--to", str(got)).returncode == 0
    assert (got / "results" / "out" / "weights.txt").read_text() == "from the sibling module"
    from PIL import Image

    with Image.open(got / "training-progress.png") as plot:  # no empty accuracy panel
        assert plot.text["Description"] == "panels: Loss, lr"
    assert "epoch" not in _cli(user, "hpcdl.jobs", "show", job_id).stdout


def test_a_script_that_raises_shows_its_own_traceback_first(store: Path, tmp_path: Path) -> None:
    import socket

    user = write_user_code(tmp_path / "user")
    (user / "raises.py").write_text("def fit(lr):\n    raise ValueError(f'learning rate {lr} too high')\n\n\nfit(9)\n")
    job_id = _submit(user, "script=raises.py")
    assert _cli(user, "hpcdl.jobs", "wait", job_id, "--timeout", "240").stdout.strip() == "FAILED"
    shown = _cli(user, "hpcdl.jobs", "show", job_id).stdout
    error = shown.split("--- error ---\n")[1]
    assert error.startswith(f"rank 0 on {socket.gethostname()}:\nTraceback (most recent call last):\n"), shown
    assert 'raises.py", line 5, in <module>\n' in error and 'line 2, in fit\n' in error
    assert "ValueError: learning rate 9 too high" in error and "hpcdl" not in error, error


def test_an_entry_that_raises_shows_its_traceback_without_hpcdls_frames(store: Path, tmp_path: Path) -> None:
    user = write_user_code(tmp_path / "user")
    (user / "failing.py").write_text("def main(config):\n    return 1 / 0\n")
    job_id = _submit(user, "entry=failing:main")
    assert _cli(user, "hpcdl.jobs", "wait", job_id, "--timeout", "240").stdout.strip() == "FAILED"
    error = _cli(user, "hpcdl.jobs", "show", job_id).stdout.split("--- error ---\n")[1]
    assert error.startswith("rank 0 on ") and 'failing.py", line 2, in main' in error, error
    assert "ZeroDivisionError: division by zero" in error and "hpcdl" not in error, error


@pytest.mark.parametrize(("args", "message"), [
    (["entry=nowhere_module:main"], "entry: cannot import 'nowhere_module'"),
    (["entry=myentry:takes_nothing"], "entry: myentry.takes_nothing() must take one argument, the config"),
    (["entry=myentry:mian"], "entry: module 'myentry' has no 'mian' (did you mean 'myentry.main'?)"),
    (["script=missing.py"], "script: missing.py is not a file"),
    (["--", "--lr", "1"], "arguments after --: only script= takes them"),
    (["script=train_ddp.py", "training.worker_load=[1,0]"], "training.worker_load: an option of the built-in trainer"),
    (["script=train_ddp.py", "entry=myentry:main"], "entry and script: give one"),
])
def test_bad_user_code_is_refused_before_submission(store: Path, tmp_path: Path, args: list[str],
                                                    message: str) -> None:
    user = write_user_code(tmp_path / "user")
    done = _cli(user, "hpcdl.submit", *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert job_folders(store) == []


def test_an_edit_after_submission_does_not_change_what_the_job_runs(store: Path, tmp_path: Path) -> None:
    import hpcdl

    user = write_user_code(tmp_path / "user")
    (user / "message.py").write_text("TEXT = 'as submitted'\n")
    (user / "late.py").write_text("import time\ntime.sleep(3)\nimport message\nprint('says', message.TEXT)\n")
    job_id = _submit(user, "script=late.py")
    (user / "message.py").write_text("TEXT = 'edited while queued'\n")  # before the job imports it
    job = hpcdl.Job.attach(job_id)
    assert job.wait(timeout=240) == "COMPLETED"
    assert "says as submitted" in job.logs()
    assert f"code      4 files" in _cli(user, "hpcdl.jobs", "show", job_id).stdout  # train_ddp, myentry, message, late


def test_a_git_work_tree_snapshot_holds_what_git_tracks_and_no_untracked_dotfile(store: Path, tmp_path: Path) -> None:
    import hpcdl

    user = write_user_code(tmp_path / "user")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org"]
    for command in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "code"]):
        subprocess.run([*git, *command], cwd=user, check=True, capture_output=True)
    token = f"hf_{secrets.token_hex(12)}"
    (user / ".env").write_text(f"HF_TOKEN={token}\n")  # untracked and not ignored: never copied
    (user / "scratch.py").write_text(f"TOKEN = {token!r}\n")
    job = hpcdl.Job.attach(_submit(user, "script=train_ddp.py"))
    assert job.wait(timeout=240) == "COMPLETED", job.error()
    tracked = subprocess.run(["git", "ls-files"], cwd=user, capture_output=True, text=True).stdout.split()
    copied = sorted(str(p.relative_to(job.folder / "code")) for p in (job.folder / "code").rglob("*") if p.is_file())
    assert copied == sorted(tracked)
    assert [p for p in job.folder.rglob("*") if p.is_file() and token.encode() in p.read_bytes()] == []


def test_a_snapshot_over_the_limit_is_refused_before_submission(store: Path, tmp_path: Path) -> None:
    user = write_user_code(tmp_path / "user")
    (user / "data.bin").write_bytes(b"\0" * (2 * 2**20))
    done = _cli(user, "hpcdl.submit", "script=train_ddp.py", "cluster.snapshot_limit_mb=1")
    assert done.returncode == 2 and "over cluster.snapshot_limit_mb=1 (largest: data.bin (2.0 MB)" in done.stderr
    assert job_folders(store) == []
    done = _cli(user, "hpcdl.submit", "script=train_ddp.py", "cluster.snapshot=false", "cluster.tasks_per_node=2")
    assert done.returncode == 0, done.stderr
