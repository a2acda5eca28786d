"""The job store, profiles and the sbatch script, without a scheduler."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcdl import ConfigError
from hpcdl.cluster.environment import exported_environment, job_environment
from hpcdl.config.cluster import ClusterConfig, time_limit_minutes, time_limit_seconds
from hpcdl.plan import JobPlan
from hpcdl.cluster.slurm import sbatch_script
from hpcdl.store.folders import find, new_job_folder, scan, write_json
from hpcdl.store.safety import UnsafeFolderError, read_job_file

RECORD = Path(__file__).parent / "data" / "sbatch_record.txt"


@pytest.mark.parametrize(("text", "minutes"), [("90", 90), ("1:30", 2), ("01:30:00", 90), ("2-00", 2880),
                                                ("2-01:30", 2970), ("1-00:00:01", 1441)])
def test_slurm_time_formats_become_minutes(text: str, minutes: int) -> None:
    assert time_limit_minutes(text) == minutes


@pytest.mark.parametrize("text", ["1h", "1:2:3:4", "", "0", "-5", "01:xx:00"])
def test_bad_time_limit_is_rejected(text: str) -> None:
    with pytest.raises(ConfigError, match="cluster.time"):
        ClusterConfig(backend="slurm", time=text)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"backend": "pbs"}, "cluster.backend: 'pbs' is not allowed; choose one of local, slurm"),
    ({"backend": "slurm", "python": "/no/such/python"}, "cluster.python: '/no/such/python' is not an executable"),
    ({"backend": "slurm", "mem": "lots"}, "cluster.mem: must be a Slurm memory size"),
    ({"backend": "slurm", "env": {"HF_TOKEN": "x"}}, "HF_TOKEN looks like a secret"),
    ({"backend": "slurm", "export": ["AWS_SECRET_ACCESS_KEY"]}, "looks like a secret"),
    ({"backend": "local", "partition": "gpu"}, "cluster.partition: a Slurm setting, but cluster.backend=local"),
    ({"backend": "slurm", "nodes": 0}, "cluster.nodes: must be a positive integer"),
])
def test_bad_profile_is_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        ClusterConfig(**kwargs)
    assert message in str(error.value)


def test_only_allow_listed_non_secret_variables_travel() -> None:
    profile = ClusterConfig(backend="slurm", export=["PATH", "HOME"])
    environ = {"PATH": "/bin", "HOME": "/h", "GITHUB_TOKEN": "t", "LD_PRELOAD": "evil.so"}
    assert exported_environment(profile, environ) == {"PATH": "/bin", "HOME": "/h"}


def test_sbatch_script_is_pinned_and_quotes_every_value(monkeypatch: pytest.MonkeyPatch) -> None:
    record_anew = bool(os.environ.get("HPCDL_RECORD"))  # HPCDL_RECORD=1 pytest ... rewrites the record
    for name in list(os.environ):
        monkeypatch.delenv(name)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("HOME", "/home/ann")
    monkeypatch.setenv("MY_API_TOKEN", "s3cr3t")
    profile = ClusterConfig(name="site", backend="slurm", python="/usr/bin/python3", partition="gpu", account="proj",
                            time="1-02:00:00", nodes=2, tasks_per_node=4, gpus_per_node=4, cpus_per_task=8,
                            mem="64G", constraint="h200", sbatch_extra={"exclusive": "user"},
                            setup=["module load cuda/12.4"], env={"NCCL_DEBUG": "WARN", "ODD": "a b'c"})
    plan = JobPlan(kind="train", name="net'; $(rm -rf ~)", cluster=profile, time_limit_s=time_limit_seconds(profile.time),
                   environment=job_environment(profile), exported=tuple(sorted(exported_environment(profile))))
    script = sbatch_script(plan, Path("/scratch/ann/jobs/id 1"))
    if record_anew:
        RECORD.write_text(script)
    assert script == RECORD.read_text()
    assert "#SBATCH --job-name='net'\"'\"'; $(rm -rf ~)'" in script
    assert "s3cr3t" not in script and "MY_API_TOKEN" not in script
    assert "#SBATCH --export=HOME,PATH" in script


def test_job_folders_are_owner_only_and_ids_unique(tmp_path: Path) -> None:
    ids = set()
    for _ in range(20):
        job_id, folder = new_job_folder(tmp_path)
        assert folder.stat().st_mode & 0o777 == 0o700
        ids.add(job_id)
    assert len(ids) == 20


def test_pickles_in_a_folder_others_can_write_are_refused(tmp_path: Path) -> None:
    result = tmp_path / "result.pkl"
    result.write_bytes(b"not loaded")
    assert read_job_file(tmp_path, "result.pkl") == b"not loaded"
    os.chmod(result, 0o666)
    with pytest.raises(UnsafeFolderError, match="writable by group or others"):
        read_job_file(tmp_path, "result.pkl")


def test_find_takes_an_id_a_prefix_a_scheduler_id_or_last(tmp_path: Path) -> None:
    for n, backend_id in enumerate(["101", "102"]):
        folder = tmp_path / f"2612{n}"
        folder.mkdir()
        write_json(folder / "manifest.json", {"id": folder.name, "name": "x", "kind": "function", "profile": "slurm",
                                              "plan": {"cluster": {"backend": "slurm"}}, "submitted_at": n,
                                              "backend_id": backend_id})
    assert find("26121", [tmp_path]).id == "26121"
    assert find("102", [tmp_path]).id == "26121"
    assert find("last", [tmp_path]).id == "26121"
    with pytest.raises(Exception, match="matches 2 jobs"):
        find("2612", [tmp_path])
    assert [r.id for r in scan([tmp_path])] == ["26120", "26121"]


def test_list_answers_1000_jobs_from_the_store_quickly(store: Path) -> None:
    store.mkdir(parents=True)
    for n in range(1000):
        folder = store / f"job{n:04d}"
        folder.mkdir()
        write_json(folder / "manifest.json", {"id": folder.name, "name": f"net{n}", "kind": "train",
                                              "profile": "local", "submitted_at": n, "backend_id": "1:0",
                                              "plan": {"cluster": {"backend": "local"},
                                                       "config": {"training": {"max_epochs": 4}}}})
        write_json(folder / "status.json", {"state": "COMPLETED", "started_at": 0, "ended_at": 60})
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hpcdl.jobs", "list"], capture_output=True, text=True, check=True)
    elapsed = time.perf_counter() - start
    lines = done.stdout.splitlines()
    assert len(lines) == 1001 and "COMPLETED" in lines[-1]
    print(f"jobs list on 1000 jobs: {elapsed:.2f} s")  # the figure is kept by benchmarks/jobs_list.py
