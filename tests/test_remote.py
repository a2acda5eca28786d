"""Remote submission through a real sshd on 127.0.0.1 (tests/sshd.py): the client submits as root, the login
node's side runs as a second account with its own store; the local backend runs the job there."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
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

from tests.sshd import Server, keygen, start_sshd

JOB = """\
import os, sys, time
lines = int(sys.argv[1]) if len(sys.argv) > 1 else 1
for n in range(lines):
    print(f"line {n}", flush=True)
    time.sleep(float(os.environ.get("PAUSE", "0")))
with open(os.path.join(os.environ["HPCDL_RESULTS_DIR"], "who.txt"), "w") as f:
    f.write(str(os.getuid()))
"""


@pytest.fixture(scope="module")
def sshd() -> Iterator[Server]:
    yield from start_sshd({})


@pytest.fixture
def client(tmp_path: Path, sshd: Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Path]]:
    """A client: its own store, profile folder, runtime folder and project (job.py); the login node's store."""
    paths = {name: tmp_path / name for name in ("store", "conf", "project")}
    for path in paths.values():
        path.mkdir(mode=0o700)
    paths["run"] = Path(tempfile.mkdtemp(prefix="hr", dir="/tmp"))  # short: a socket path has at most 107 bytes
    paths["remote_store"] = sshd.remote_folder("store")
    (paths["project"] / "job.py").write_text(JOB)
    write_profile(paths["conf"], sshd, paths["remote_store"])
    monkeypatch.setenv("HPCDL_STORE", str(paths["store"]))
    monkeypatch.setenv("HPCDL_CONFIG_DIR", str(paths["conf"]))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(paths["run"]))
    monkeypatch.chdir(paths["project"])
    yield paths
    for socket in (paths["run"] / "hpcdl-ssh").glob("*"):  # the masters this client left
        subprocess.run(["ssh", "-o", f"ControlPath={socket}", "-O", "exit", "x"], capture_output=True)
    shutil.rmtree(paths["run"], ignore_errors=True)
    shutil.rmtree(paths["remote_store"], ignore_errors=True)


def write_profile(conf: Path, sshd: Server, store: Path, name: str = "site", backend: str = "local",
                  **remote: object) -> None:
    (conf / "cluster").mkdir(exist_ok=True)
    settings = {"host": sshd.host, "python": sshd.python, "connect_timeout_s": 5,
                "ssh_options": sshd.ssh_options(), **remote}
    (conf / "cluster" / f"{name}.yaml").write_text(json.dumps(
        {"name": name, "backend": backend, "store": str(store), "time": "00:10:00", "remote": settings}))


def cli(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def submitted(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stderr
    return re.search(r"^Submitted (\S+) on ", done.stdout, re.M).group(1)


def test_a_script_submitted_through_the_login_node_runs_there_and_its_results_come_down(
        client: dict[str, Path], sshd: Server) -> None:
    ssh_home = Path.home() / ".ssh"
    before = sorted(ssh_home.iterdir()) if ssh_home.is_dir() else None
    job = submitted(cli("hpcdl.submit", "cluster=site", "script=job.py", "--", "3"))
    folder = client["remote_store"] / job
    assert folder.stat().st_uid == sshd.uid  # the job lives on the login node's side, as its account
    assert not (client["store"] / job).exists()
    assert cli("hpcdl.jobs", "wait", job).stdout.strip() == "COMPLETED"
    assert cli("hpcdl.jobs", "logs", job).stdout == "line 0\nline 1\nline 2\n"
    assert "COMPLETED" in cli("hpcdl.jobs", "show", job).stdout
    fetched = cli("hpcdl.jobs", "fetch", job, "--to", str(client["project"] / "got"))
    assert fetched.returncode == 0, fetched.stderr
    assert (client["project"] / "got" / "results" / "who.txt").read_text() == str(sshd.uid)
    assert str(client["project"] / "got") in fetched.stdout and "{fetched}" not in fetched.stdout
    assert not list(client["project"].glob(".got.partial-*"))
    listed = cli("hpcdl.jobs", "list", "cluster=site")
    assert re.search(rf"^{job}\s+\S+\s+site\s+COMPLETED", listed.stdout, re.M), listed.stdout
    assert (sorted(ssh_home.iterdir()) if ssh_home.is_dir() else None) == before  # ~/.ssh untouched
    sockets = client["run"] / "hpcdl-ssh"
    assert sockets.stat().st_mode & 0o777 == 0o700 and len(list(sockets.iterdir())) == 1  # one master, reused


def test_a_remote_fetch_never_writes_into_what_another_user_planted_where_it_points(
        client: dict[str, Path], sshd: Server, tmp_path: Path) -> None:
    """As the local fetch (tests/test_store_security.py): --to a planted link, another user's folder, or a shared
    folder of ours holding another user's file under a result's name is never written through."""
    job = submitted(cli("hpcdl.submit", "cluster=site", "script=job.py", "wait=true"))
    shared = tmp_path / "shared"  # a folder every user may write, as /tmp
    shared.mkdir()
    os.chmod(shared, 0o1777)
    os.chmod(tmp_path, 0o755)
    home = tmp_path / "private"
    home.mkdir()
    (shared / "mine").symlink_to(home)
    theirs = shared / "theirs"
    theirs.mkdir(mode=0o777)
    (shared / "results").mkdir()
    planted = shared / "results" / "who.txt"
    planted.write_text("")
    os.chmod(planted, 0o666)
    for path in (shared / "mine", theirs, shared / "results", planted):
        os.chown(path, sshd.uid, sshd.uid, follow_symlinks=False)  # the second account's
    fetched = cli("hpcdl.jobs", "fetch", job, "--to", str(shared / "mine"))
    assert fetched.returncode == 1 and f"{shared / 'mine'}: is a symbolic link" in fetched.stderr, fetched.stderr
    fetched = cli("hpcdl.jobs", "fetch", job, "--to", str(theirs))
    assert fetched.returncode == 1 and f"{theirs}: is owned by uid {sshd.uid}, not by you" in fetched.stderr
    fetched = cli("hpcdl.jobs", "fetch", job, "--to", str(shared))
    assert fetched.returncode == 1 and f"{shared / 'results'}: is owned by uid {sshd.uid}" in fetched.stderr
    assert list(home.iterdir()) == [] and list(theirs.iterdir()) == [] and planted.read_text() == ""
    assert not list(Path(tempfile.gettempdir()).glob("hpcdl-fetch-*"))  # nothing left of the transfers
    fresh = shared / "new"
    fetched = cli("hpcdl.jobs", "fetch", job, "--to", str(fresh))
    assert fetched.returncode == 0, fetched.stderr
    assert fresh.stat().st_mode & 0o777 == 0o700 and (fresh / "results" / "who.txt").read_text() == str(sshd.uid)


def test_the_doctor_of_a_remote_profile_runs_on_its_login_node(client: dict[str, Path]) -> None:
    done = cli("hpcdl.doctor", "cluster=site", "--timeout", "120", timeout=180)
    assert done.returncode == 0, (done.stdout, done.stderr)
    job = re.search(r"^job (\S+): checking 1 node\(s\) of profile site \.\.\.$", done.stdout, re.M).group(1)
    assert (client["remote_store"] / job).is_dir() and not (client["store"] / job).exists()  # allocated there
    assert re.search(r"^  store +passed", done.stdout, re.M) and "0 failed check(s) on 1 node(s)" in done.stdout


def test_jobs_list_shows_what_was_last_seen_marked_offline_while_the_login_node_is_unreachable(
        client: dict[str, Path], sshd: Server) -> None:
    job = submitted(cli("hpcdl.submit", "cluster=site", "script=job.py"))
    seen = cli("hpcdl.jobs", "list", "cluster=site").stdout
    assert job in seen
    write_profile(client["conf"], sshd, client["remote_store"], ssh_options=["Port=1", *sshd.ssh_options()[1:]])
    offline = cli("hpcdl.jobs", "list", "cluster=site")
    assert offline.returncode == 0, offline.stderr
    assert offline.stdout.startswith("# offline: as last seen at ") and job in offline.stdout
    assert "cannot reach the login node" in offline.stderr


def _no_traces(client: dict[str, Path], connected: bool) -> None:
    """Nothing left on either side: no client record, nothing in the login node's store, and no master unless
    the login succeeded (it is kept for the next command)."""
    sockets = client["run"] / "hpcdl-ssh"
    assert (sockets.is_dir() and len(list(sockets.iterdir())) == 1) if connected else \
        not sockets.is_dir() or not list(sockets.iterdir())
    assert not list(client["store"].rglob("*.json"))
    assert not list(client["remote_store"].iterdir())


@pytest.mark.parametrize("change, message", [
    ({"ssh_options": ["Port=1"]}, "cannot reach the login node"),
    ({"host": "hpcdlremote@10.255.255.1"}, "cannot reach the login node"),
    ("wrong key", "refused the login"),
    ({"python": "/usr/bin/no-such-python"}, "cluster.remote.python='/usr/bin/no-such-python': not found on"),
])
def test_an_unusable_login_node_fails_fast_and_clearly_leaving_nothing(
        client: dict[str, Path], sshd: Server, tmp_path: Path, change: object, message: str) -> None:
    if change == "wrong key":
        change = {"ssh_options": sshd.ssh_options(key=keygen(tmp_path / "other_key"))}
    elif "ssh_options" in change:
        change = {"ssh_options": [*change["ssh_options"], *sshd.ssh_options()[1:]]}
    write_profile(client["conf"], sshd, client["remote_store"], **change)
    started = time.monotonic()
    done = cli("hpcdl.submit", "cluster=site", "script=job.py")
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert time.monotonic() - started < 5 + 5  # the connect timeout, and python's start
    _no_traces(client, connected="python" in change)


def test_a_login_node_without_hpcdl_or_with_another_version_says_how_to_install_this_one(
        client: dict[str, Path], sshd: Server) -> None:
    write_profile(client["conf"], sshd, client["remote_store"], python="/usr/bin/python3")
    done = cli("hpcdl.submit", "cluster=site", "script=job.py")
    assert done.returncode == 2, done.stderr
    assert "hpcdl is not installed for /usr/bin/python3" in done.stderr
    assert "-m pip install --user 'hpcdl==0.1.0'" in done.stderr
    other = subprocess.run([sys.executable, "-m", "hpcdl.agent", "--expect", "0.0.1", "jobs", "list"],
                           capture_output=True, text=True)
    assert other.returncode == 3 and "the client has 0.0.1" in other.stderr


def master_pid(run: Path) -> int:
    sockets = list((run / "hpcdl-ssh").iterdir())
    checked = subprocess.run(["ssh", "-o", f"ControlPath={sockets[0]}", "-O", "check", "x"], capture_output=True,
                             text=True)
    return int(re.search(r"pid=(\d+)", checked.stderr).group(1))


def test_logs_follow_connects_again_after_the_connection_drops_and_shows_every_line_once(
        client: dict[str, Path], sshd: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    write_profile(client["conf"], sshd, client["remote_store"])
    (client["project"] / "job.py").write_text(JOB.replace('os.environ.get("PAUSE", "0")', '"0.4"'))
    job = submitted(cli("hpcdl.submit", "cluster=site", "script=job.py", "--", "20"))
    follow = subprocess.Popen([sys.executable, "-m", "hpcdl.jobs", "logs", job, "-f"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert follow.stdout.readline() == "line 0\n"
        os.kill(master_pid(client["run"]), signal.SIGKILL)  # the connection is cut
        out, err = follow.stdout.read(), follow.stderr.read()  # not communicate: it skips what readline buffered
        follow.wait(timeout=60)
    finally:
        follow.kill()
    assert follow.returncode == 0, err
    assert "line 0\n" + out == "".join(f"line {n}\n" for n in range(20))
    assert "connecting again" in err


def test_after_the_first_submission_only_changed_files_are_sent_and_the_job_gets_the_whole_tree(
        client: dict[str, Path], sshd: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    project = client["project"]
    (project / "lib").mkdir()
    (project / "lib" / "big.bin").write_bytes(os.urandom(4 << 20))
    (project / "lib" / "small.txt").write_text("one")
    first = submitted(cli("hpcdl.submit", "cluster=site", "script=job.py"))
    (project / "lib" / "small.txt").write_text("two")
    sent: list[int] = []
    from hpcdl.remote import client as remote_client
    from hpcdl.remote.client import submit_remote
    from hpcdl.remote.transfer import pack

    monkeypatch.setattr(remote_client, "pack", lambda stream, folder, names: (sent.append(len(names)),
                                                                              pack(stream, folder, names)))
    records = client["store"] / f".remote-{os.getuid()}"
    before = set(records.glob("job-*.json"))
    assert submit_remote(["cluster=site", "script=job.py"]) == 0
    assert sent == [1]  # small.txt alone: big.bin and job.py were kept on the login node
    (record,) = set(records.glob("job-*.json")) - before  # ids of one second sort by their random part
    second = record.stem.removeprefix("job-")
    assert second != first
    code = client["remote_store"] / second / "code"
    assert (code / "lib" / "small.txt").read_text() == "two"
    assert (code / "lib" / "big.bin").read_bytes() == (project / "lib" / "big.bin").read_bytes()
    assert (code / "job.py").is_file()
    for kept in Path(pwd.getpwuid(sshd.uid).pw_dir, ".cache", "hpcdl", "remote").glob("tree-*"):
        shutil.rmtree(kept)  # the login node lost its copy: every file is sent again
    (project / "lib" / "small.txt").write_text("three")
    sent.clear()
    assert submit_remote(["cluster=site", "script=job.py"]) == 0
    assert sent == [1, 3]


def test_a_secret_reaches_the_remote_job_and_is_written_on_neither_side(
        client: dict[str, Path], sshd: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    token = "tok-" + os.urandom(8).hex()
    monkeypatch.setenv("MY_API_TOKEN", token)
    (client["project"] / "job.py").write_text(
        "import hashlib, os\nopen(os.path.join(os.environ['HPCDL_RESULTS_DIR'], 'seen.txt'), 'w').write("
        "hashlib.sha256(os.environ.get('MY_API_TOKEN', '').encode()).hexdigest())\n")
    job = submitted(cli("hpcdl.submit", "cluster=site", "script=job.py", "cluster.secrets=[MY_API_TOKEN]"))
    assert cli("hpcdl.jobs", "wait", job).stdout.strip() == "COMPLETED"
    # the job's file holds only a digest of what it saw; the value itself is in no file of either side
    seen = (client["remote_store"] / job / "results" / "seen.txt").read_text()
    assert seen == hashlib.sha256(token.encode()).hexdigest()
    home = Path(pwd.getpwuid(sshd.uid).pw_dir)
    for root in (client["remote_store"], home / ".cache", client["store"], client["project"]):
        for path in root.rglob("*"):
            if path.is_file():
                assert token.encode() not in path.read_bytes(), path


def test_cancel_from_the_client_ends_the_remote_job(client: dict[str, Path]) -> None:
    (client["project"] / "job.py").write_text("import time\nprint('started', flush=True)\ntime.sleep(120)\n")
    job = submitted(cli("hpcdl.submit", "cluster=site", "script=job.py"))
    cancelled = cli("hpcdl.jobs", "cancel", job)
    assert cancelled.returncode == 0 and "state now CANCELLED" in cancelled.stdout, cancelled.stdout + cancelled.stderr
    assert "CANCELLED" in cli("hpcdl.jobs", "show", job).stdout


def test_a_transfer_cut_midway_submits_nothing_and_leaves_nothing_on_the_login_node(tmp_path: Path) -> None:
    """The agent as the login node runs it, given a request and a code tar cut short (a dropped connection)."""
    import io
    import tarfile

    from hpcdl.remote.protocol import hpcdl_version

    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "job.py").write_bytes(b"print('x')\n" * 50000)
    whole = io.BytesIO()
    with tarfile.open(fileobj=whole, mode="w|") as tar:
        tar.add(tmp_path / "project" / "job.py", arcname="job.py")
    store = tmp_path / "store"
    request = {"profile": {"name": "site", "backend": "local", "store": str(store)}, "overrides": ["script=job.py"],
               "script_args": [], "multirun": False, "secrets": {}}
    cut = json.dumps(request).encode() + b"\n" + whole.getvalue()[:len(whole.getvalue()) // 2]
    done = subprocess.run([sys.executable, "-m", "hpcdl.agent", "--expect", hpcdl_version(), "submit"], input=cut,
                          capture_output=True, env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert done.returncode == 1 and b"error: submit on " in done.stderr and b"Traceback" not in done.stderr
    assert not store.exists() or not [p for p in store.iterdir() if not p.name.startswith(".")]
    assert list((tmp_path / "cache" / "hpcdl" / "remote").iterdir()) == []


@pytest.mark.parametrize("member", ["../outside.txt", "/etc/passwd-copy", "link"])
def test_files_received_over_the_connection_stay_inside_their_folder(tmp_path: Path, member: str) -> None:
    import io
    import tarfile

    from hpcdl.errors import HpcdlError
    from hpcdl.remote.transfer import unpack

    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w") as tar:
        info = tarfile.TarInfo(member)
        if member == "link":
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
        else:
            info.size = 2
            tar.addfile(info, io.BytesIO(b"hi"))
    stream.seek(0)
    into = tmp_path / "into"
    into.mkdir()
    with pytest.raises(HpcdlError, match="only plain files and folders inside"):
        unpack(stream, into)
    assert list(into.iterdir()) == [] and not (tmp_path / "outside.txt").exists()


def test_a_remote_dry_run_shows_what_the_login_node_would_start_and_submits_nothing(
        client: dict[str, Path]) -> None:
    done = cli("hpcdl.submit", "cluster=site", "script=job.py", "dry_run=true")
    assert done.returncode == 0, done.stderr
    assert "dry run: nothing was submitted" in done.stderr and "hpcdl.worker" in done.stderr
    assert not list(client["store"].rglob("job-*.json")) and not list(client["remote_store"].iterdir())


def test_every_jobs_verb_of_an_id_and_every_option_value_is_known_to_the_routing() -> None:
    """A jobs verb added later that takes an ID goes to the login node of a remote job too, and the value of
    each of its options is not taken for the ID."""
    import argparse

    from hpcdl.jobs import parser
    from hpcdl.remote.routing import ID_VERBS, OPTIONS_WITH_VALUES

    verbs = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    taking_id = {name for name, sub in verbs.items() if any(a.dest == "id" for a in sub._actions)}
    assert taking_id == set(ID_VERBS)
    with_values = {option for name in taking_id for a in verbs[name]._actions if a.option_strings
                   and a.nargs is None and not isinstance(a, (argparse._HelpAction, argparse._StoreTrueAction))
                   for option in a.option_strings if option.startswith("--")}
    assert with_values <= set(OPTIONS_WITH_VALUES), with_values - set(OPTIONS_WITH_VALUES)


def test_a_config_group_file_only_the_client_has_is_shipped_with_the_submission(client: dict[str, Path]) -> None:
    (client["conf"] / "training").mkdir()
    (client["conf"] / "training" / "mine.yaml").write_text("max_epochs: 7\nmini_batch_size: 24\n")
    job = submitted(cli("hpcdl.submit", "cluster=site", "script=job.py", "training=mine"))
    training = json.loads((client["remote_store"] / job / "manifest.json").read_text())["plan"]["config"]["training"]
    assert (training["max_epochs"], training["mini_batch_size"]) == (7, 24)
    assert cli("hpcdl.jobs", "wait", job).stdout.strip() == "COMPLETED"
    missing = cli("hpcdl.submit", "cluster=site", "script=job.py", "training=nosuch")
    assert missing.returncode != 0 and "nosuch" in missing.stderr  # refused here, before the login node


def test_the_agent_takes_only_group_files_by_their_plain_names(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcdl.agent import _as_profile
    from hpcdl.errors import HpcdlError

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # the agent's process ends in its home and keeps its config folder: undone after
    monkeypatch.setenv("HPCDL_CONFIG_DIR", str(tmp_path / "config"))  # undone after, as the agent sets it
    for key in ("../x.yaml", "cluster/site.yaml", "data/../../x.yaml", "/etc/x.yaml", "data/a.yml", "data"):
        with pytest.raises(HpcdlError, match="only GROUP/NAME.yaml"):
            with _as_profile({"name": "site"}, {key: "x: 1\n"}):
                pass
    with _as_profile({"name": "site"}, {"data/mine.yaml": "root: /d\n"}) as (_, work):
        assert (work / "config" / "data" / "mine.yaml").read_text() == "root: /d\n"
    assert not list((tmp_path / "hpcdl" / "remote").glob(".incoming-*"))


def test_a_jobs_list_of_this_store_says_in_one_line_how_to_list_the_jobs_on_login_nodes(
        client: dict[str, Path]) -> None:
    assert cli("hpcdl.jobs", "list").stderr == ""
    job = submitted(cli("hpcdl.submit", "cluster=site", "script=job.py"))
    local = cli("hpcdl.jobs", "list")
    assert local.returncode == 0 and job not in local.stdout
    assert local.stderr == ("note: 1 job(s) were submitted from here to login nodes; list them with "
                            "python -m hpcdl.jobs list cluster=site\n")
    assert job in cli("hpcdl.jobs", "list", "cluster=site").stdout
