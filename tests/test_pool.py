"""Held pools without a cluster: bad settings refused with the option named, before anything is written; the
pools folder is the user's alone; the holder's script is the one the idle timeout needs; a submission claims the
pool only while its holder has not released it (the cluster's tests: tests/test_slurm_pool.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpcdl.cluster.slurm_pool import holder_script, sbatch_command
from hpcdl.config import ClusterConfig
from hpcdl.errors import ConfigError
from hpcdl.store.pools import PoolRecord, claim_use, load_pools, note_use, pools_folder
from hpcdl.store.safety import UnsafeFolderError
from tests.conftest import job_folders


def _hpcdl(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", ["", "1abc", "a/b", "../x", "a b", "a;rm", "x" * 41, "a\nb"])
def test_a_pool_name_that_is_not_a_plain_word_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match="cluster.pool: .* is not a pool name"):
        ClusterConfig(backend="slurm", pool=name)


def test_a_local_job_on_a_pool_and_a_local_pool_are_refused(store: Path, tmp_path: Path) -> None:
    refused = _hpcdl(tmp_path, "hpcdl.submit", "cluster.pool=mine")
    assert refused.returncode == 2 and "cluster.pool: backend=local holds no pools" in refused.stderr
    started = _hpcdl(tmp_path, "hpcdl.pool", "start", "name=mine")
    assert started.returncode == 2 and "backend=local holds no pools" in started.stderr
    assert job_folders(store) == [] and load_pools(store) == []


@pytest.mark.parametrize("settings, message", [
    (["idle_timeout=soon"], "idle_timeout: 'soon' is not a Slurm time limit"),
    (["idle_timeout=00:05"], "idle_timeout: 5 s is too short"),
    (["name=a;b"], "name: 'a;b' is not a pool name"),
    (["nodes"], "'nodes': give KEY=VALUE"),
    (["nodes=0"], "cluster.nodes"),
])
def test_bad_pool_settings_are_refused_before_anything_is_held(store: Path, tmp_path: Path, settings: list[str],
                                                               message: str) -> None:
    started = _hpcdl(tmp_path, "hpcdl.pool", "start", "cluster=slurm", *settings)
    assert started.returncode == 2 and message in started.stderr, started.stderr
    assert load_pools(store) == []


def test_the_pools_folder_of_another_user_or_open_to_others_is_refused(store: Path) -> None:
    folder = pools_folder(store, create=True)
    assert folder is not None and (os.stat(folder).st_mode & 0o777) == 0o700
    os.chmod(folder, 0o777)
    with pytest.raises(UnsafeFolderError, match="writable by group or others"):
        load_pools(store)


def test_the_holder_ends_after_its_idle_timeout_and_every_value_is_an_argument_of_its_own(tmp_path: Path) -> None:
    folder = tmp_path / "it's; $(x)"
    script = holder_script(folder, 600)
    assert "idle=600" in script and "sleep 5" in script and "exit 0" in script
    assert "'" + str(folder).replace("'", "'\"'\"'") + "/last-used'" in script  # quoted: no shell in a path
    command = sbatch_command(ClusterConfig(backend="slurm", nodes=2, time="00:30:00", partition="debug"), folder,
                             "mine")
    assert command[:2] == ["sbatch", "--parsable"] and command[-1] == str(folder / "holder.sh")
    assert {"--nodes=2", "--time=30", "--partition=debug", "--job-name=hpcdl-pool-mine"} <= set(command)


def test_a_submission_claims_the_pool_unless_its_holder_released_it_or_announced_that_it_would(tmp_path: Path) -> None:
    pool = PoolRecord(name="p", folder=tmp_path, backend="slurm", backend_id="7", profile={}, idle_timeout_s=10,
                      started_at=0.0)
    assert claim_use(pool) and (tmp_path / "last-used").exists()
    announced = tmp_path / "releasing"
    announced.touch()  # the holder announced; it sees the claim's touch and goes on
    threading.Timer(0.3, announced.unlink).start()
    started = time.monotonic()
    assert claim_use(pool) and time.monotonic() - started >= 0.25  # it waited for the holder's decision

    def release() -> None:
        (tmp_path / "released.json").write_text('{"at": 1, "idle_s": 10}\n')
        announced.unlink()

    announced.touch()  # the holder announced before the claim's touch: it releases
    threading.Timer(0.3, release).start()
    assert not claim_use(pool)
    with pytest.raises(ConfigError, match="pool p .scheduler id 7. released its allocation, idle, while the job"):
        note_use(pool, "261206-101010-abcd")
    assert not (tmp_path / "job-261206-101010-abcd").exists() and pool.job_ids() == []
