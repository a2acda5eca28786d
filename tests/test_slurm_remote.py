"""Remote submission to the real test cluster through a real sshd (tests/sshd.py): the login node's account
submits with sbatch; the client keeps nothing that the job needs."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.sshd import REMOTE_USER, Server, start_sshd
from tests.test_remote import JOB, cli, client, master_pid, submitted, write_profile  # noqa: F401 - the fixture
from tests.test_slurm import slurm_cluster  # noqa: F401 - the fixture

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def sshd() -> Iterator[Server]:
    conf = os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")
    for server in start_sshd({"SLURM_CONF": conf}):
        asked = subprocess.run(["su", REMOTE_USER, "-s", "/bin/sh", "-c", f"SLURM_CONF={conf} sinfo -h"],
                               capture_output=True, text=True, timeout=30)
        if asked.returncode != 0:  # a cluster brought up before slurm/cluster.sh let other accounts in
            pytest.fail(f"{REMOTE_USER} cannot use the test cluster ({asked.stderr.strip()[:200]}); "
                        "its state folder and munge folder must be 0711 (slurm/cluster.sh up sets them)")
        yield server


@pytest.fixture
def site(client: dict[str, Path], sshd: Server) -> dict[str, Path]:
    write_profile(client["conf"], sshd, client["remote_store"], backend="slurm")
    return client


def _scheduler_user(job_folder: Path) -> str:
    backend_id = json.loads((job_folder / "manifest.json").read_text())["backend_id"]
    sacct = subprocess.run(["sacct", "-n", "-X", "-P", "-j", str(backend_id), "-o", "Submit,User"],
                           capture_output=True, text=True, check=True)
    return max(line.split("|") for line in sacct.stdout.split())[1]  # the newest of a job id a restarted test
    # cluster gave out again (its accounting keeps the earlier one)


def test_a_job_submitted_remotely_runs_on_after_the_client_is_killed_and_a_new_client_fetches_it(
        site: dict[str, Path], sshd: Server, tmp_path: Path) -> None:
    (site["project"] / "job.py").write_text(JOB.replace('os.environ.get("PAUSE", "0")', '"0.5"'))
    client = subprocess.Popen([sys.executable, "-m", "hpcdl.submit", "cluster=site", "script=job.py", "wait=true",
                               "--", "6"], start_new_session=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    records = site["store"] / f".remote-{os.getuid()}"
    deadline = time.monotonic() + 60
    while not list(records.glob("job-*.json")) and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(client.pid, signal.SIGKILL)  # the laptop is shut: the client and all it started
    client.wait()
    (record,) = records.glob("job-*.json")
    job = json.loads(record.read_text())["id"]
    fresh = {"HPCDL_STORE": str(tmp_path / "new-client"), "XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="hn", dir="/tmp")}
    try:
        waited = cli("hpcdl.jobs", "wait", job, "cluster=site", env=fresh, timeout=300)
        assert waited.stdout.strip() == "COMPLETED", waited.stderr
        got = tmp_path / "got"
        fetched = cli("hpcdl.jobs", "fetch", job, "cluster=site", "--to", str(got), env=fresh)
        assert fetched.returncode == 0, fetched.stderr
    finally:
        for socket in Path(fresh["XDG_RUNTIME_DIR"], "hpcdl-ssh").glob("*"):
            subprocess.run(["ssh", "-o", f"ControlPath={socket}", "-O", "exit", "x"], capture_output=True)
        shutil.rmtree(fresh["XDG_RUNTIME_DIR"], ignore_errors=True)
    assert (got / "results" / "who.txt").read_text() == str(sshd.uid)
    assert _scheduler_user(site["remote_store"] / job) == REMOTE_USER


def test_logs_follow_of_a_slurm_job_survives_a_cut_connection(site: dict[str, Path]) -> None:
    (site["project"] / "job.py").write_text(JOB.replace('os.environ.get("PAUSE", "0")', '"0.4"'))
    job = submitted(cli("hpcdl.submit", "cluster=site", "script=job.py", "--", "25"))
    follow = subprocess.Popen([sys.executable, "-m", "hpcdl.jobs", "logs", job, "-f"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        first = follow.stdout.readline()
        os.kill(master_pid(site["run"]), signal.SIGKILL)
        out, err = follow.stdout.read(), follow.stderr.read()  # not communicate: it skips what readline buffered
        follow.wait(timeout=60)
    finally:
        follow.kill()
    assert follow.returncode == 0, err
    shown = (first + out).splitlines()  # submitit's own lines around the script's, each once
    assert [line for line in shown if line.startswith("line ")] == [f"line {n}" for n in range(25)]
    assert len(shown) == len(set(shown)), shown
    assert "connecting again" in err


def test_a_twenty_point_sweep_submitted_remotely_completes_there(site: dict[str, Path]) -> None:
    done = cli("hpcdl.submit", "-m", "cluster=site", "script=job.py", "training.seed=range(20)", timeout=300)
    sweep = submitted(done)
    waited = cli("hpcdl.jobs", "wait", sweep, timeout=600)
    assert waited.returncode == 0 and waited.stdout.strip().endswith("COMPLETED"), waited.stdout + waited.stderr
    listed = cli("hpcdl.jobs", "list", "cluster=site").stdout
    assert re.search(rf"^{sweep}\s.*20/20 done: 20 COMPLETED", listed, re.M), listed


def test_profiles_check_of_a_slurm_profile_shows_its_partitions_and_what_it_cannot_have() -> None:
    checked = cli("hpcdl.profiles", "check", "slurm")
    assert checked.returncode == 0, checked.stderr
    assert re.search(r"^debug\*\s+2\s+4\s+0\s+none$", checked.stdout, re.M), checked.stdout
    too_big = cli("hpcdl.profiles", "check", "slurm", "cluster.nodes=3")
    assert too_big.returncode == 1 and "problem: cluster.nodes=3: partition debug has 2 node(s)" in too_big.stderr


def test_profiles_check_of_a_remote_profile_asks_its_login_node(site: dict[str, Path]) -> None:
    checked = cli("hpcdl.profiles", "check", "site", "cluster.time=10")
    assert checked.returncode == 0, checked.stderr
    assert "profile   site (slurm)" in checked.stdout and re.search(r"^debug\*\s+2\s+4", checked.stdout, re.M)
    too_many = cli("hpcdl.profiles", "check", "site", "cluster.tasks_per_node=5")
    assert too_many.returncode == 1 and "the nodes of partition debug have 4 CPUs" in too_many.stderr


def test_the_doctor_of_a_remote_slurm_profile_allocates_through_its_login_node(site: dict[str, Path]) -> None:
    done = cli("hpcdl.doctor", "cluster=site", "cluster.nodes=2", "--timeout", "240", timeout=300)
    assert done.returncode == 0, (done.stdout, done.stderr)
    job = re.search(r"^job (\S+): checking 2 node\(s\) of profile site", done.stdout, re.M).group(1)
    assert _scheduler_user(site["remote_store"] / job) == REMOTE_USER  # the login node's account asked Slurm
    assert "n1 (" in done.stdout and "n2 (" in done.stdout and "0 failed check(s) on 2 node(s)" in done.stdout


def test_a_pool_is_held_from_the_client_through_the_login_node_and_runs_its_jobs(
        site: dict[str, Path], sshd: Server) -> None:
    started = cli("hpcdl.pool", "start", "cluster=site", "name=far", "time=00:10:00", "--wait", "240")
    assert started.returncode == 0 and "RUNNING" in started.stdout, started.stderr
    held = started.stdout.split("(Slurm job ")[1].split(")")[0]
    try:
        job = submitted(cli("hpcdl.submit", "cluster=site", "cluster.pool=far", "cluster.time=2", "script=job.py"))
        assert cli("hpcdl.jobs", "wait", job).stdout.strip() == "COMPLETED"
        assert f"{held} (pool far)" in cli("hpcdl.jobs", "list", "cluster=site").stdout
        steps = subprocess.run(["sacct", "-n", "-P", "-o", "JobName,State", "-j", held], capture_output=True,
                               text=True, check=True).stdout
        assert f"{job}|COMPLETED" in steps  # a step of the held job
        owner = subprocess.run(["squeue", "-h", "-j", held, "-o", "%u"], capture_output=True, text=True).stdout
        assert owner.strip() == REMOTE_USER  # held by the login node's account
        listed = cli("hpcdl.pool", "list", "cluster=site").stdout
        assert re.search(rf"^far\s+{held}\s+RUNNING\s+1\s+\S+\s+0:15:00\s+1$", listed, re.M), listed
    finally:
        stopped = cli("hpcdl.pool", "stop", "far", "cluster=site")
    assert stopped.returncode == 0 and f"Pool far ({held}) released" in stopped.stdout, stopped.stderr
    assert not (site["store"] / f".pools-{os.getuid()}").exists()  # held there, nothing of it here
