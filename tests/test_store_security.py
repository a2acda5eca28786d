"""The store as a hostile co-user meets it, on the local backend: swapped links, planted folders, ids that
are paths, secrets through every key and names that carry newlines or shell code."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import pickle
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

import hpcdl
from hpcdl.errors import ConfigError, HpcdlError
from hpcdl.host import process_id
from hpcdl.store.files import FINAL, FUNCTION_RESULT, MANIFEST
from hpcdl.store.safety import UnsafeFolderError
from tests.conftest import job_folders

ROOT = Path(__file__).resolve().parent.parent
OTHER_USER = "hpcdl-other"
SECRET = "hf_" + secrets.token_hex(12)  # made at run time: no file of the code snapshot holds it


def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's hpcdl from any folder
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env=environment)


def answer() -> int:
    return 42


def token_digest() -> str | None:
    """What a rank sees of HF_TOKEN, as a digest (the result file must not hold the value either)."""
    value = os.environ.get("HF_TOKEN")
    return None if value is None else hashlib.sha256(value.encode()).hexdigest()


class Planted:
    """An attacker's pickle: unpickling it creates the folder it names."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple:
        return os.mkdir, (self.marker,)


def _completed_function_job(store: Path) -> hpcdl.Job:
    job = hpcdl.batch(answer, cluster="local")
    assert job.result(timeout=120) == 42
    return job


def _files_holding(folder: Path, text: str) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


# --- reading a job folder ------------------------------------------------------------------------------

@pytest.mark.parametrize("swap", ["folder", "file"])
def test_a_folder_or_result_swapped_for_a_link_never_runs_the_attackers_pickle(store: Path, tmp_path: Path,
                                                                              swap: str) -> None:
    job = _completed_function_job(store)
    marker = tmp_path / "attacker-code-ran"
    attacker = tmp_path / "attacker"
    shutil.copytree(job.folder, attacker)
    (attacker / FUNCTION_RESULT).write_bytes(pickle.dumps(Planted(marker)))
    real, link = (job.folder, job.folder) if swap == "folder" else (job.folder / FUNCTION_RESULT,) * 2
    target = attacker if swap == "folder" else attacker / FUNCTION_RESULT
    aside = real.with_name(real.name + ".aside")
    stop = threading.Event()
    by_path: list[bytes] = []

    def swapper() -> None:  # the co-user: the real entry and a link to the attacker's take turns
        while not stop.is_set():
            os.rename(real, aside)
            os.symlink(target, link)
            with contextlib.suppress(OSError):  # a plain read by path, to prove the swap is seen
                by_path.append((job.folder / FUNCTION_RESULT).read_bytes())
            os.unlink(link)
            os.rename(aside, real)

    thread = threading.Thread(target=swapper)
    thread.start()
    outcomes = {"result": 0, "refused": 0}
    try:
        deadline = time.monotonic() + 20
        for _ in range(3000):
            if time.monotonic() > deadline:
                break
            try:
                assert job.result(timeout=0) == 42
                outcomes["result"] += 1
            except (UnsafeFolderError, FileNotFoundError, HpcdlError, TimeoutError):  # TimeoutError: the
                outcomes["refused"] += 1  # final state was not seen through the swap, so no result yet
            assert not marker.exists(), "the attacker's pickle ran"
    finally:
        stop.set()
        thread.join()
    assert not marker.exists()
    assert (attacker / FUNCTION_RESULT).read_bytes() in by_path, "a plain read never met the attacker's file"
    assert sum(outcomes.values()) > 0, outcomes  # how often each side won is the scheduler's, not asserted
    assert job.result(timeout=0) == 42, "the real result no longer reads once the swapping stops"


def test_files_in_a_job_folder_are_read_only_when_yours_alone(store: Path, tmp_path: Path) -> None:
    job = _completed_function_job(store)
    os.chmod(job.folder / FUNCTION_RESULT, 0o666)
    with pytest.raises(UnsafeFolderError, match=r"result.pkl: is writable by group or others"):
        job.result(timeout=0)
    os.chmod(job.folder / FUNCTION_RESULT, 0o600)
    (job.folder / FUNCTION_RESULT).unlink()
    (job.folder / FUNCTION_RESULT).symlink_to(tmp_path / "elsewhere.pkl")
    with pytest.raises(UnsafeFolderError, match="symbolic link"):
        job.result(timeout=0)


def test_a_store_others_may_write_is_refused_with_its_path(store: Path) -> None:
    _completed_function_job(store)
    os.chmod(store, 0o777)
    listing = _cli("hpcdl.jobs", "list")
    assert listing.returncode == 1
    assert listing.stderr.startswith(f"error: job store {store}: is writable by group or others")
    with pytest.raises(UnsafeFolderError, match="a store must be yours alone"):
        hpcdl.batch(answer, cluster="local")
    os.chmod(store, 0o700)
    assert len(job_folders(store)) == 1


@pytest.mark.parametrize("key", ["../x", "..", "/etc", "a/../../b", "~root", ".hidden"])
def test_ids_that_are_paths_are_refused(store: Path, key: str) -> None:
    _completed_function_job(store)
    for verb in ("show", "fetch", "cancel", "logs"):
        done = _cli("hpcdl.jobs", verb, key)
        assert done.returncode == 1
        assert f"error: {key!r} is not a job id" in done.stderr


def test_a_manifest_whose_id_is_a_path_is_damaged_and_fetch_writes_only_into_the_target(
        store: Path, tmp_path: Path) -> None:
    job = _completed_function_job(store)
    manifest = json.loads((job.folder / MANIFEST).read_text())
    manifest["id"] = "../../escaped"
    (job.folder / MANIFEST).write_text(json.dumps(manifest))
    work = tmp_path / "work" / "here"
    work.mkdir(parents=True)
    listing = _cli("hpcdl.jobs", "list", cwd=work)
    assert listing.returncode == 0
    assert job.id in listing.stdout and "DAMAGED" in listing.stdout
    assert "'../../escaped' is not the folder's name" in listing.stderr
    fetched = _cli("hpcdl.jobs", "fetch", job.id, cwd=work)
    assert fetched.returncode == 1 and "damaged" in fetched.stderr
    assert not (tmp_path / "escaped").exists() and not (work.parent.parent / "escaped").exists()


def test_a_job_folder_that_is_a_link_is_refused(store: Path, tmp_path: Path) -> None:
    job = _completed_function_job(store)
    moved = tmp_path / "moved"
    os.rename(job.folder, moved)
    os.symlink(moved, job.folder)
    shown = _cli("hpcdl.jobs", "show", job.id)
    assert shown.returncode == 1
    assert f"error: {job.folder}: is a symbolic link" in shown.stderr


# --- folders planted by another user -------------------------------------------------------------------

@pytest.fixture
def other_uid() -> int:
    """The uid of a second account (created when missing); tests that plant its folders need root."""
    if os.getuid() != 0:
        pytest.skip("planting another user's folders needs root")
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(OTHER_USER).pw_uid
    subprocess.run(["useradd", "-m", OTHER_USER], check=True, capture_output=True)
    return pwd.getpwnam(OTHER_USER).pw_uid


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen]:
    """A process of ours that a planted manifest names as its job."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    yield process
    process.kill()
    process.wait()


def _plant(store: Path, name: str, uid: int, pid: int, mode: int = 0o755) -> Path:
    """A newer-looking job folder whose manifest names a path as its id and our process as its own."""
    folder = store / name
    folder.mkdir()
    manifest = {"id": "../../planted-output", "name": "planted", "kind": "train", "profile": "local",
                "plan": {"cluster": {"backend": "local"}}, "submitted_at": time.time() + 3600,
                "backend_id": process_id(pid), "submitted_from": {"host": os.uname().nodename, "cwd": "/"}}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    (folder / FINAL).write_text(json.dumps({"state": "COMPLETED"}))
    (folder / "result.json").write_text(json.dumps({"planted": True}))
    for path in (folder, *folder.iterdir()):
        os.chown(path, uid, uid)
    os.chmod(folder, mode)
    return folder


def test_a_planted_folder_never_takes_over_last_fetch_or_cancel(store: Path, tmp_path: Path, other_uid: int,
                                                                bystander: subprocess.Popen) -> None:
    mine = _completed_function_job(store)
    planted = _plant(store, "991231-235959-dead", other_uid, bystander.pid)
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)

    listing = _cli("hpcdl.jobs", "list", cwd=work)
    assert listing.returncode == 0
    assert mine.id in listing.stdout and "planted" not in listing.stdout and planted.name not in listing.stdout
    assert f"note: skipped {planted}: is owned by uid {other_uid}, not by you" in listing.stderr

    shown = _cli("hpcdl.jobs", "show", "last", cwd=work)
    assert shown.returncode == 0 and f"job       {mine.id}" in shown.stdout

    fetched = _cli("hpcdl.jobs", "fetch", "last", cwd=work)
    assert fetched.returncode == 0 and fetched.stdout.splitlines()[0] == "42"
    assert sorted(os.listdir(work)) == [mine.id]
    assert not (tmp_path / "planted-output").exists()

    for verb in ("cancel", "show", "fetch"):
        done = _cli("hpcdl.jobs", verb, planted.name, cwd=work)
        assert done.returncode == 1, done.stdout
        assert f"error: {planted}: is owned by uid {other_uid}, not by you" in done.stderr
    assert bystander.poll() is None, "a planted manifest's pid was signalled"
    with pytest.raises(UnsafeFolderError):
        hpcdl.Job.attach(planted.name)


def test_a_folder_of_yours_that_others_may_write_is_skipped_like_a_planted_one(
        store: Path, bystander: subprocess.Popen) -> None:
    mine = _completed_function_job(store)
    loose = _plant(store, "991231-235959-beef", os.getuid(), bystander.pid, mode=0o777)
    listing = _cli("hpcdl.jobs", "list")
    assert listing.returncode == 0 and loose.name not in listing.stdout
    assert f"note: skipped {loose}: is writable by group or others" in listing.stderr
    assert hpcdl.Job.attach("last").id == mine.id
    cancel = _cli("hpcdl.jobs", "cancel", loose.name)
    assert cancel.returncode == 1 and bystander.poll() is None


def write_results() -> int:
    """A job with something to fetch: its metrics and a file of its results folder."""
    hpcdl.report(1, 0.5)
    results = Path(os.environ["HPCDL_JOB_FOLDER"], "results")  # what fetch copies of a function's job
    results.mkdir(exist_ok=True)  # made for the user code already
    (results / "weights.bin").write_bytes(b"mine")
    return 42


def _as_other(uid: int, *paths: Path) -> None:
    for path in paths:
        os.chown(path, uid, uid, follow_symlinks=False)


def test_fetch_into_a_shared_folder_never_writes_into_what_another_user_planted(store: Path, tmp_path: Path,
                                                                               other_uid: int) -> None:
    job = hpcdl.batch(write_results, cluster="local")
    assert job.result(timeout=120) == 42
    shared = tmp_path / "shared"  # a folder every user may write, as /tmp
    shared.mkdir(mode=0o1777)
    os.chmod(shared, 0o1777)
    os.chmod(tmp_path, 0o755)
    planted = shared / "metrics.jsonl"  # the co-user's files, made for us to write into: they would read them
    planted.write_text("")
    (shared / "results").mkdir()
    os.chmod(planted, 0o666)
    home = tmp_path / "home" / "private"
    home.mkdir()
    (shared / "mine").symlink_to(home)  # --to a link to our home
    theirs = shared / "theirs"
    theirs.mkdir(mode=0o777)
    _as_other(other_uid, planted, shared / "results", shared / "mine", theirs)

    fetched = _cli("hpcdl.jobs", "fetch", job.id, "--to", str(shared / "mine"))
    assert fetched.returncode == 1 and f"error: {shared / 'mine'}: is a symbolic link" in fetched.stderr
    assert list(home.iterdir()) == []
    fetched = _cli("hpcdl.jobs", "fetch", job.id, "--to", str(theirs))
    assert fetched.returncode == 1 and f"error: {theirs}: is owned by uid {other_uid}, not by you" in fetched.stderr
    assert list(theirs.iterdir()) == []

    fetched = _cli("hpcdl.jobs", "fetch", job.id, "--to", str(shared))  # a folder of ours others may write
    assert fetched.returncode == 1 and f"{shared / 'results'}: is owned by uid {other_uid}" in fetched.stderr
    assert planted.stat().st_uid == os.getuid() and planted.stat().st_mode & 0o777 == 0o600, \
        "the co-user's file was written into"
    assert b'"loss": 0.5' in planted.read_bytes()
    assert not (home / "weights.bin").exists() and list((shared / "results").iterdir()) == []

    fresh = shared / "new"
    fetched = _cli("hpcdl.jobs", "fetch", job.id, "--to", str(fresh))
    assert fetched.returncode == 0, fetched.stderr
    assert fresh.stat().st_mode & 0o777 == 0o700 and (fresh / "results" / "weights.bin").read_bytes() == b"mine"


# --- secrets and names ---------------------------------------------------------------------------------

@pytest.mark.parametrize("override, message", [
    ("+cluster.network.extra.HF_TOKEN=abc", "cluster.network.extra: HF_TOKEN looks like a secret"),
    ("+cluster.env.WANDB_API_KEY=abc", "cluster.env: WANDB_API_KEY looks like a secret"),
    ("cluster.export=[PATH,HF_TOKEN]", "cluster.export: HF_TOKEN looks like a secret"),
    (f"+cluster.env.FOO={SECRET}", "cluster.env.FOO: holds the value of HF_TOKEN from this shell"),
    (f"+cluster.network.extra.NCCL_X={SECRET}", "cluster.network.extra.NCCL_X: holds the value of HF_TOKEN"),
    (f"name=run-{SECRET}", "name: holds the value of HF_TOKEN"),
    (f"cluster.setup=['echo {SECRET}']", "cluster.setup[0]: holds the value of HF_TOKEN"),
    ("+cluster.network.extra.BAD-NAME=1", "cluster.network.extra: 'BAD-NAME' is not a variable name"),
    ("cluster.secrets=[MISSING_TOKEN]", "cluster.secrets: MISSING_TOKEN not set in this shell"),
    ("cluster.secrets=['A B']", "cluster.secrets: 'A B' is not a variable name"),
])
def test_secrets_through_any_key_are_refused_before_submission(store: Path, monkeypatch: pytest.MonkeyPatch,
                                                               override: str, message: str) -> None:
    monkeypatch.setenv("HF_TOKEN", SECRET)
    done = _cli("hpcdl.submit", override)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"error: {message}" in done.stderr
    assert SECRET not in done.stdout
    assert job_folders(store) == []


def test_a_network_key_cannot_inject_shell_lines() -> None:
    from hpcdl.config import ClusterConfig
    from hpcdl.config.network import NetworkConfig

    with pytest.raises(ConfigError, match="is not a variable name"):
        ClusterConfig(backend="slurm", network=NetworkConfig(extra={"X=1; touch /tmp/pwned #": "v"}))


def test_batch_refuses_secret_values_and_control_characters(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", SECRET)
    with pytest.raises(ConfigError, match=r"cluster.setup\[0\]: holds the value of HF_TOKEN"):
        hpcdl.batch(answer, cluster="local", setup=[f"echo {SECRET}"])
    with pytest.raises(ConfigError, match="name: holds the value of HF_TOKEN"):
        hpcdl.batch(answer, cluster="local", name=SECRET)
    with pytest.raises(ConfigError, match="batch: name: must be a non-empty line without control characters"):
        hpcdl.batch(answer, cluster="local", name="x\n#SBATCH --wrap=touch /tmp/pwned")
    assert job_folders(store) == []
    from hpcdl.config import ClusterConfig

    with pytest.raises(ConfigError, match="cluster.partition: .* holds a control character"):
        ClusterConfig(backend="slurm", partition="debug\n#SBATCH --uid=0")


def test_a_declared_secret_reaches_the_job_and_no_file(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", SECRET)
    preview = _cli("hpcdl.submit", "cluster.secrets=[HF_TOKEN]", "dry_run=true")
    assert preview.returncode == 0 and "HF_TOKEN=<secret" in preview.stdout and SECRET not in preview.stdout
    job = hpcdl.batch(token_digest, cluster="local", secrets=["HF_TOKEN"])
    assert job.result(timeout=120) == hashlib.sha256(SECRET.encode()).hexdigest()
    assert job.manifest["plan"]["cluster"]["secrets"] == ["HF_TOKEN"]
    assert _files_holding(job.folder, SECRET) == []
    undeclared = hpcdl.batch(token_digest, cluster="local")
    assert undeclared.result(timeout=120) is None


def test_a_newline_name_is_refused_and_a_shell_name_stays_text(store: Path, tmp_path: Path) -> None:
    refused = _cli("hpcdl.submit", "name=a\nb", "dry_run=false")
    assert refused.returncode == 2 and job_folders(store) == []
    marker = tmp_path / "shell-ran"
    name = f"$(touch {marker}) `touch {marker}`; touch {marker}"
    job = hpcdl.batch(answer, cluster="local", name=name)
    assert job.result(timeout=120) == 42
    assert not marker.exists()
    listing = _cli("hpcdl.jobs", "list")
    assert name.split()[0] in listing.stdout and not marker.exists()


# --- a lab's shared store ------------------------------------------------------------------------------

@pytest.fixture(params=[0o1777, 0o2770], ids=["sticky", "setgid-group"])
def shared_store(request: pytest.FixtureRequest, other_uid: int, tmp_path: Path,
                 monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A store every user of a lab may write: /tmp-like with the sticky bit, or a group folder with setgid."""
    base = Path(tempfile.mkdtemp(prefix="hpcdl-shared-", dir="/tmp"))  # a path the second user can reach
    os.chmod(base, 0o755)
    store = base / "store"
    store.mkdir()
    os.chown(store, 0, pwd.getpwuid(other_uid).pw_gid)
    os.chmod(store, request.param)
    monkeypatch.setenv("HPCDL_STORE", str(store))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    yield store
    shutil.rmtree(base)


def _as_other_user(code: str, *args: str) -> subprocess.CompletedProcess:
    """Python ``code`` run by the second account itself (its own uid, umask and files), with the system's
    Python (root's own may be out of its reach; `jobs list` needs no package beyond the standard library)."""
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    return subprocess.run([python, "-c", code, *args], user=OTHER_USER, group=OTHER_USER, extra_groups=[],
                          capture_output=True, text=True,
                          timeout=120, cwd="/", env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT),
                                                     "HOME": "/tmp", "HPCDL_STORE": os.environ["HPCDL_STORE"]})


_OTHER_USERS_JOBS = """
import json, os, pickle, sys, time
store, pid, marker = sys.argv[1], int(sys.argv[2]), sys.argv[3]
class Planted:
    def __reduce__(self):
        return os.mkdir, (marker,)
for name, mode in (("991231-235959-aaaa", 0o700), ("991231-235959-bbbb", 0o755)):
    folder = os.path.join(store, name)
    os.mkdir(folder)
    os.chmod(folder, mode)
    manifest = {"id": name, "name": "theirs-" + name[-4:], "kind": "function", "profile": "local",
                "plan": {"cluster": {"backend": "local"}}, "submitted_at": time.time() + 3600,
                "backend_id": f"{pid}:1@x", "submitted_from": {"host": "x", "cwd": "/"}}
    for file, content in (("manifest.json", json.dumps(manifest)), ("final.json", '{"state": "COMPLETED"}')):
        with open(os.path.join(folder, file), "w") as f:
            f.write(content)
    with open(os.path.join(folder, "result.pkl"), "wb") as f:
        pickle.dump(Planted(), f)
os.mkdir(os.path.join(store, ".hpcdl-index-0"), 0o777)  # where root's index would go: planted first
os.chmod(os.path.join(store, ".hpcdl-index-0"), 0o777)
with open(os.path.join(store, ".hpcdl-index-0", "rows.jsonl"), "w") as f:
    f.write('{"version": 1, "uid": 0}\\n["991231-235959-dddd", 0, 0, "RUNNING", "", 0, "fake", "train", "local", '
            '"local", null, null, null, null, null, null, null]\\n')
"""


def test_a_shared_store_keeps_each_users_jobs_their_own(shared_store: Path, other_uid: int, tmp_path: Path,
                                                       bystander: subprocess.Popen) -> None:
    marker = tmp_path / "attacker-code-ran"
    os.chmod(tmp_path, 0o777)  # the attacker's pickle could create its marker here, were it ever loaded
    planted = _as_other_user(_OTHER_USERS_JOBS, str(shared_store), str(bystander.pid), str(marker))
    assert planted.returncode == 0, planted.stderr
    mine = _completed_function_job(shared_store)  # a shared store is accepted (it was refused outright)
    assert mine.folder.stat().st_mode & 0o777 == 0o700 and mine.folder.stat().st_uid == os.getuid()

    listing = _cli("hpcdl.jobs", "list")
    assert listing.returncode == 0, listing.stderr
    assert [line.split()[0] for line in listing.stdout.splitlines()[1:]] == [mine.id]
    assert "991231-235959" not in listing.stderr  # others' jobs are expected in a shared store: no note
    assert f"note: skipped {shared_store / '.hpcdl-index-0'}" in listing.stderr  # the planted index is not used

    everyone = _cli("hpcdl.jobs", "list", "--all")
    assert everyone.returncode == 0, everyone.stderr
    rows = {line.split()[0]: line.split() for line in everyone.stdout.splitlines()[1:]}
    assert rows[mine.id][-1] == "root"
    assert rows["991231-235959-bbbb"][1:4] == ["theirs-bbbb", "local", "COMPLETED"]
    assert rows["991231-235959-bbbb"][-1] == OTHER_USER
    assert rows["991231-235959-aaaa"][-1] == OTHER_USER  # private, but root reads every folder
    assert "991231-235959-dddd" not in everyone.stdout

    for verb in ("cancel", "show", "fetch"):
        for name in ("991231-235959-aaaa", "991231-235959-bbbb"):
            done = _cli("hpcdl.jobs", verb, name, cwd=tmp_path)
            assert done.returncode == 1 and f"is owned by uid {other_uid}, not by you" in done.stderr
    assert bystander.poll() is None and not marker.exists()

    theirs = _as_other_user("import sys; from hpcdl.jobs import main; sys.exit(main(['list', '--all']))")
    assert theirs.returncode == 0, theirs.stderr
    seen = {line.split()[0]: line for line in theirs.stdout.splitlines()[1:]}
    assert "PRIVATE" in seen[mine.id] and "answer" not in theirs.stdout  # my job is mine alone
    assert _as_other_user("import sys; from hpcdl.jobs import main; sys.exit(main(['cancel', sys.argv[1]]))",
                          mine.id).returncode == 1
    assert mine.state == "COMPLETED" and mine.result(timeout=0) == 42


def test_a_listing_of_another_users_newest_jobs_reads_the_newest_segments_alone(
        shared_store: Path, other_uid: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Other users' rows stand among yours by the time their ids say: `--user U --limit N` and `--all --limit N`
    read the newest segments of the index, as a listing of your own newest does (they stood before every row)."""
    from hpcdl.lifecycle.listing import select
    from hpcdl.store import segments
    from tests.test_store import _ended_job

    now = time.time()
    for n in range(12):
        _ended_job(shared_store, n, submitted_at=now - 1000 + n)
    theirs = {}
    for age, tag in ((2000, "aaaa"), (-10, "bbbb")):  # one older than all of yours, one newer
        folder = shared_store / f"{time.strftime('%y%m%d-%H%M%S', time.localtime(now - age))}-{tag}"
        folder.mkdir(mode=0o700)
        os.chown(folder, other_uid, other_uid)
        theirs[tag] = folder.name
    monkeypatch.setattr(segments, "SEGMENT", 3)
    every = [r.id for r in select([shared_store], everyone=True).records]  # writes the index: five segments
    assert every[0] == theirs["aaaa"] and every[-1] == theirs["bbbb"] and len(every) == 14
    read = []
    monkeypatch.setattr(segments.StoreIndex, "segment_rows",
                        lambda self, segment, skipped=None: read.append(segment) or segments._segment_rows(
                            self.root, segment, self.stale, skipped)[0])
    assert [r.id for r in select([shared_store], users={other_uid}, limit=1).records] == [theirs["bbbb"]]
    assert len(read) == 1
    read.clear()
    assert [r.id for r in select([shared_store], everyone=True, limit=2).records] == every[-2:]
    assert len(read) == 1
    assert [r.id for r in select([shared_store], users={other_uid}, since=now - 1500).records] == [theirs["bbbb"]]


_PLANT_REMOTE_RECORD = """
import json, os, sys
store, uid, job, marker = sys.argv[1:5]
folder = os.path.join(store, ".remote-" + uid)
os.mkdir(folder, 0o755)
login = {"host": "example", "python": "python3", "connect_timeout_s": 5, "persist_s": 60,
         "ssh_options": ["ProxyCommand=touch " + marker]}
with open(os.path.join(folder, "job-" + job + ".json"), "w") as f:
    json.dump({"id": job, "profile": "planted", "login": login, "store": None}, f)
"""


def test_a_remote_record_planted_in_a_shared_store_never_reaches_ssh(shared_store: Path, tmp_path: Path) -> None:
    """A co-user's `.remote-<your uid>` folder, whose record names your job and an ssh option that runs a
    command, is refused: your jobs commands stay local and run nothing of theirs."""
    mine = _completed_function_job(shared_store)
    marker = Path("/tmp") / f"hpcdl-remote-planted-{os.getpid()}"
    planted = _as_other_user(_PLANT_REMOTE_RECORD, str(shared_store), str(os.getuid()), mine.id, str(marker))
    assert planted.returncode == 0, planted.stderr
    shown = _cli("hpcdl.jobs", "show", mine.id)
    assert shown.returncode == 0, shown.stderr
    assert "COMPLETED" in shown.stdout and "your remote jobs' records are not used" in shown.stderr, shown.stderr
    assert not marker.exists()
