"""The job store, profiles and the sbatch script, without a scheduler."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcdl import ConfigError
from hpcdl.config.environment import exported_environment, job_environment
from hpcdl.config.cluster import ClusterConfig, time_limit_minutes, time_limit_seconds
from hpcdl.plan import JobPlan
from hpcdl.cluster.slurm import sbatch_script
from hpcdl.store.folders import new_job_folder, new_named_folder, write_json
from hpcdl.store.listing import find, scan
from hpcdl.store.safety import UnsafeFolderError, read_job_file
from tests.conftest import job_folders

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
    done = subprocess.run([sys.executable, "-m", "hpcdl.jobs", "list", "--limit", "0"], capture_output=True,
                          text=True, check=True)
    elapsed = time.perf_counter() - start
    lines = done.stdout.splitlines()
    assert len(lines) == 1001 and "COMPLETED" in lines[-1]
    newest = subprocess.run([sys.executable, "-m", "hpcdl.jobs", "list"], capture_output=True, text=True, check=True)
    assert newest.stdout.splitlines() == [lines[0], *lines[-50:]]  # as typed: the newest 50, and how to see more
    assert "note: the newest 50 shown; --limit N shows more, --limit 0 every one" in newest.stderr
    print(f"jobs list on 1000 jobs: {elapsed:.2f} s")  # the figure is kept by benchmarks/jobs_list.py


def _ended_job(store: Path, n: int, state: str = "COMPLETED", submitted_at: float = 0.0, name: str = "") -> Path:
    """An ended job's folder, written as hpcdl writes it (each state write marks the job for the index)."""
    from hpcdl.store.status import write_final

    folder = new_named_folder(store, f"261203-{n:06d}-beef")
    write_json(folder / "manifest.json", {"id": folder.name, "name": name or f"net{n}", "kind": "train",
                                          "profile": "local", "submitted_at": submitted_at or time.time(),
                                          "backend_id": "1:0", "plan": {"cluster": {"backend": "local"}}})
    started = submitted_at or time.time()
    write_final(folder, state, started_at=started, ended_at=started + 60)
    return folder


def _list(*args: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "hpcdl.jobs", "list", *args], capture_output=True, text=True,
                          check=True)
    return done.stdout.splitlines()[1:]


def _add_jobs(store: Path, first: int, count: int) -> None:
    for n in range(first, first + count):
        _ended_job(store, n)


def _index_files(store: Path) -> dict[Path, list]:
    """Each file of this user's index in ``store`` (its head, its segments) with its rows."""
    from hpcdl.store.changes import index_folder

    files = {}
    for path in index_folder(store).glob("*.jsonl"):
        lines = path.read_text().splitlines()
        files[path] = [json.loads(line) for line in lines[2 if path.name == "head.jsonl" else 1:]]
    return files


def test_thirty_concurrent_submissions_each_reach_the_index_while_listings_run(store: Path) -> None:
    from concurrent.futures import ProcessPoolExecutor

    from hpcdl.store.changes import index_folder
    from hpcdl.store.index import ID
    from hpcdl.store.listing import scan as scan_index

    store.mkdir(mode=0o700)
    _add_jobs(store, 0, 1)
    scan_index([store])  # the index exists: the submissions below only mark their jobs
    with ProcessPoolExecutor(max_workers=8) as pool:
        submissions = [pool.submit(_add_jobs, store, n, 1) for n in range(1, 31)]
        listings = [pool.submit(scan_index, [store]) for _ in range(10)]
        for future in submissions + listings:
            future.result()
    assert len(_list()) == 31
    rows = [row for rows in _index_files(store).values() for row in rows]
    assert sorted(row[ID] for row in rows) == sorted(job_folders(store))
    assert not [p for p in index_folder(store).iterdir() if p.name.endswith(".changed")]


def test_the_index_is_never_trusted_over_the_folders(store: Path, tmp_path: Path) -> None:
    store.mkdir(mode=0o700)
    kept = _ended_job(store, 1, "FAILED")
    _ended_job(store, 2)
    assert len(_list()) == 2

    def segment() -> tuple[Path, str, list[str]]:  # the one segment of ended jobs' rows
        (path,) = [path for path in _index_files(store) if path.name.startswith("ended-")]
        header, *lines = path.read_text().splitlines()
        return path, header, lines

    rows, header, lines = segment()
    lying = json.loads(lines[0])
    lying[3:5] = "COMPLETED", ""  # a state its folder does not hold
    rows.write_text("\n".join([header, json.dumps(lying), *lines[1:]]) + "\n")
    os.utime(kept, ns=(1, 1))  # the row's recorded modification time no longer matches its folder's
    assert "FAILED" in next(line for line in _list() if kept.name in line)
    assert "FAILED" in next(line for line in _list() if kept.name in line)  # its row written again
    rows, header, lines = segment()
    planted = json.loads(lines[0])
    planted[0] = "../../escaped"  # a path for an id
    rows.write_text("\n".join([header, json.dumps(planted), '{"id": 1}', *lines[1:]]) + "\n")
    assert [line.split()[:4:3] for line in _list()] == [[kept.name, "FAILED"], ["261203-000002-beef", "COMPLETED"]]
    rows, header, lines = segment()
    rows.write_text(header + "\nnot json\n")
    assert len(_list()) == 2
    assert not (tmp_path / "escaped").exists()
    shutil.rmtree(kept)  # removed behind the index's back
    (store / "261203-000009-beef").mkdir()  # a folder that is no job (no manifest)
    assert [line.split()[0] for line in _list()] == ["261203-000002-beef"]


def test_a_sweeps_points_are_ended_together_in_their_own_folders_alone_and_the_index_told_once(
        store: Path, tmp_path: Path) -> None:
    from hpcdl.store.changes import index_folder
    from hpcdl.store.listing import scan as scan_index
    from hpcdl.store.status import write_finals

    store.mkdir(mode=0o700)
    ended = _ended_job(store, 1)
    running = [_ended_job(store, n) for n in (2, 3)]
    for folder in running:
        (folder / "final.json").unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (store / "261203-000004-beef").symlink_to(elsewhere)  # a link where a point's folder was: never written
    scan_index([store])  # the index has its rows: the jobs below change behind it
    ids = [ended.name, *(f.name for f in running), "261203-000004-beef", "261203-000005-beef"]
    assert write_finals(store, ids, "CANCELLED", reason="sweep cancelled") == [f.name for f in running]
    assert json.loads((ended / "final.json").read_text())["state"] == "COMPLETED"
    assert [json.loads((f / "final.json").read_text())["reason"] for f in running] == ["sweep cancelled"] * 2
    assert len({(f / "final.json").stat().st_ino for f in running}) == 1  # one file, written once, linked twice
    assert list(elsewhere.iterdir()) == [] and not (store / "261203-000005-beef").exists()
    (mark,) = [p.name for p in index_folder(store).iterdir() if not p.name.endswith(".jsonl") and p.name != "lock"]
    assert mark.startswith("changed-")  # one file for the index, not a mark a job
    assert {r.id: r.state for r in scan_index([store])} == {ended.name: "COMPLETED", running[0].name: "CANCELLED",
                                                             running[1].name: "CANCELLED"}
    assert not (index_folder(store) / mark).exists()
    rows = {row[0]: row[3] for rows in _index_files(store).values() for row in rows}
    assert rows == {ended.name: "COMPLETED", running[0].name: "CANCELLED", running[1].name: "CANCELLED"}


def test_the_store_folder_is_listed_again_once_it_changed_behind_the_index(store: Path) -> None:
    from hpcdl.store import segments

    store.mkdir(mode=0o700)
    kept = _ended_job(store, 1)
    gone = _ended_job(store, 2)
    time.sleep(segments.STAMP_MARGIN_NS / 1e9 + 0.1)
    assert len(_list()) == 2
    head = segments.index_folder(store) / "head.jsonl"
    assert json.loads(head.read_text().splitlines()[0])["stamp"] is not None  # the next listing lists no folder
    added = store / "261203-000003-beef"
    shutil.copytree(kept, added)  # copied, not written by hpcdl: no mark
    manifest = json.loads((added / "manifest.json").read_text())
    (added / "manifest.json").write_text(json.dumps({**manifest, "id": added.name, "name": "copied"}))
    shutil.rmtree(gone)
    assert [line.split()[:2] for line in _list()] == [[kept.name, "net1"], [added.name, "copied"]]


def test_a_listing_of_the_newest_reads_the_newest_segments_alone(store: Path, monkeypatch) -> None:
    from hpcdl.lifecycle.listing import select
    from hpcdl.store import segments

    store.mkdir(mode=0o700)
    now = time.time()
    for n in range(12):
        _ended_job(store, n, "FAILED" if n == 1 else "COMPLETED", submitted_at=now - 1000 + n)
    monkeypatch.setattr(segments, "SEGMENT", 3)
    every = [r.id for r in select([store]).records]  # writes the index: four segments of three rows
    assert len(every) == 12 and len([p for p in _index_files(store) if p.name.startswith("ended-")]) == 4
    read = []
    monkeypatch.setattr(segments.StoreIndex, "segment_rows",
                        lambda self, segment, skipped=None: read.append(segment) or segments._segment_rows(
                            self.root, segment, self.stale, skipped)[0])
    assert [r.id for r in select([store], limit=2).records] == every[-2:] and len(read) == 1
    read.clear()
    assert [r.id for r in select([store], limit=4).records] == every[-4:] and len(read) == 2
    read.clear()
    assert [r.id for r in select([store], since=now - 1000 + 6.5).records] == every[7:] and len(read) == 2
    assert [r.id for r in select([store], state="FAILED", limit=1).records] == [every[1]]


def test_list_filters_by_state_since_name_and_limit(store: Path) -> None:
    store.mkdir(mode=0o700)
    now = time.time()
    for n, (state, age_days) in enumerate([("COMPLETED", 40), ("FAILED", 20), ("FAILED", 2), ("CANCELLED", 1),
                                           ("COMPLETED", 0.1)]):
        _ended_job(store, n, state, submitted_at=now - age_days * 86400, name="resnet" if n % 2 else "vit")
    ids = lambda *args: [line.split()[0] for line in _list(*args)]  # noqa: E731
    every = ids()
    assert len(every) == 5
    assert ids("--state", "failed") == [every[1], every[2]]
    assert ids("--since", "7d") == every[2:]
    assert ids("--since", time.strftime("%Y-%m-%d", time.localtime(now - 30 * 86400))) == every[1:]
    assert ids("--name", "res*", "--limit", "1") == [every[3]]
    assert ids("--state", "FAILED", "--limit", "1") == [every[2]]
    refused = subprocess.run([sys.executable, "-m", "hpcdl.jobs", "list", "--since", "last tuesday"],
                             capture_output=True, text=True)
    assert refused.returncode == 1 and "'last tuesday' is neither a date" in refused.stderr


def test_clean_removes_old_ended_jobs_and_never_a_running_one(store: Path) -> None:
    from hpcdl.host import process_id

    store.mkdir(mode=0o700)
    now = time.time()
    old_failed = _ended_job(store, 1, "FAILED", submitted_at=now - 40 * 86400)
    old_completed = _ended_job(store, 2, "COMPLETED", submitted_at=now - 40 * 86400)
    recent = _ended_job(store, 3, "FAILED", submitted_at=now - 86400)
    running = new_named_folder(store, "261203-000004-beef")
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as process:
        write_json(running / "manifest.json", {"id": running.name, "name": "long", "kind": "train",
                                               "profile": "local", "submitted_at": now - 50 * 86400,
                                               "backend_id": process_id(process.pid),
                                               "plan": {"cluster": {"backend": "local"}}})
        write_json(running / "status.json", {"state": "RUNNING", "started_at": now - 50 * 86400})
        clean = [sys.executable, "-m", "hpcdl.jobs", "clean", "--older-than", "30d"]
        dry = subprocess.run([*clean, "--state", "FAILED", "--dry-run"], capture_output=True, text=True, check=True)
        assert f"would remove {old_failed.name}" in dry.stdout and old_failed.exists()
        done = subprocess.run([*clean, "--state", "FAILED"], capture_output=True, text=True, check=True)
        assert done.stdout.splitlines()[-1] == "1 job(s) removed"
        assert job_folders(store) == sorted([old_completed.name, recent.name, running.name])
        subprocess.run(clean, capture_output=True, text=True, check=True)
        assert job_folders(store) == sorted([recent.name, running.name])
        assert process.poll() is None
        process.kill()
    assert [line.split()[0] for line in _list()] == [running.name, recent.name]
