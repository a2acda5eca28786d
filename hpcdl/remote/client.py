"""The client side: submit through a login node, and run the jobs commands there (python -m hpcdl.submit and
python -m hpcdl.jobs hand over here when the profile, or the job asked for, is remote)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Callable, Optional, Sequence

from hpcdl.errors import HpcdlError
from hpcdl.remote.protocol import (AGENT, FETCHED, GROUP_FILE, GROUP_NAME, RESEND, WRONG_VERSION, hpcdl_version,
                                   install_hint)
from hpcdl.remote.routing import is_site_override, job_key
from hpcdl.remote.records import (Site, last_listing, remember_job, remember_listing, remember_sent, sent_tree,
                                  site_of)
from hpcdl.remote.transfer import digests, pack, unpack
from hpcdl.remote.ssh import SSH_FAILED, Login, RemoteError, connect, remote_command

if TYPE_CHECKING:
    from hpcdl.config.cluster import ClusterConfig

RECONNECT_TRIES = 20
"""How often logs -f and watch try to connect again after the connection dropped, 3 s apart."""


def _tee(stream: IO[bytes], kept: list[bytes], show: bool) -> threading.Thread:
    """A thread copying ``stream`` to this stderr (when ``show``) and into ``kept``."""

    def copy() -> None:
        for line in iter(stream.readline, b""):
            kept.append(line)
            if show:
                sys.stderr.write(line.decode(errors="replace"))
                sys.stderr.flush()

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread


def run_agent(site: Site, args: Sequence[str], *, send: Optional[Callable[[IO[bytes]], None]] = None,
              read: Optional[Callable[[IO[bytes]], None]] = None, show_stderr: bool = True) -> tuple[int, str]:
    """Run ``python -m hpcdl.agent ARGS`` on ``site``'s login node: (exit status, its stderr).

    ``send`` writes its stdin; ``read`` consumes its stdout (else it is this stdout). RemoteError when the
    connection failed, or hpcdl is missing or another version there.
    """
    connect(site.login)
    argv = [site.login.python, "-m", AGENT, "--expect", hpcdl_version(), *args]
    env = {"HPCDL_STORE": site.store} if site.store else {}
    process = subprocess.Popen(remote_command(site.login, argv, env), stdin=subprocess.PIPE if send else
                               subprocess.DEVNULL, stdout=subprocess.PIPE if read else None, stderr=subprocess.PIPE)
    kept: list[bytes] = []
    tee = _tee(process.stderr, kept, show_stderr)
    try:
        if send:
            try:
                send(process.stdin)
                process.stdin.close()
            except BrokenPipeError:
                pass  # the agent stopped reading: its status and stderr say why
        if read:
            read(process.stdout)
        status = process.wait()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    tee.join()
    said = b"".join(kept).decode(errors="replace")
    _check_agent(site, status, said)
    return status, said


def _check_agent(site: Site, status: int, said: str) -> None:
    login = site.login
    if status == SSH_FAILED:
        raise RemoteError(f"the connection to {login.host} dropped ({said.strip() or 'no message'})")
    if status == WRONG_VERSION:
        raise RemoteError(f"{login.host} has another hpcdl: {said.strip()}; {install_hint(login.python, login.host)}")
    if status == 127:
        raise RemoteError(f"cluster.remote.python={login.python!r}: not found on {login.host}; set it to the python "
                          f"that has hpcdl there, or {install_hint(login.python, login.host)}")
    if "No module named hpcdl" in said or "No module named 'hpcdl" in said:
        raise RemoteError(f"hpcdl is not installed for {login.python} on {login.host}; "
                          f"{install_hint(login.python, login.host)}")


# --- submit ------------------------------------------------------------------------------------------------

def _may_be_remote(overrides: Sequence[str]) -> bool:
    """Cheaply: whether the profile picked could be remote (a remote override, or a profile file naming one)."""
    from hpcdl.config.compose import profile_file

    if any(o.lstrip("+").startswith("cluster.remote.host=") for o in overrides):
        return True
    names = [o.partition("=")[2] for o in overrides if o.partition("=")[0] == "cluster"]
    path = profile_file(names[-1]) if names else None
    if path is None or "remote" not in path.read_text():
        return False
    import yaml

    data = yaml.safe_load(path.read_text())
    return not isinstance(data, dict) or not isinstance(data.get("remote"), dict) or bool(data["remote"].get("host"))


def _site(profile: ClusterConfig) -> Optional[tuple[Site, dict]]:
    """The site of a composed profile and the profile to run there (its remote block cleared); None: not remote."""
    from hpcdl.config.remote import RemoteConfig

    if profile.remote.host is None:
        return None
    shipped = dataclasses.asdict(dataclasses.replace(profile, remote=RemoteConfig()))
    return Site(profile.name, Login.of(profile.remote), profile.store), shipped


def _site_of_name(picked: Sequence[str]) -> Optional[Site]:
    """The site of a jobs command's ``cluster=NAME``, read from the profile's file alone when it holds the remote
    block (no composition: listing stays quick); None: compose it."""
    import yaml

    from hpcdl.config.compose import profile_file
    from hpcdl.config.remote import RemoteConfig

    names = [word.partition("=")[2] for word in picked if word.partition("=")[0] == "cluster"]
    path = profile_file(names[0]) if len(picked) == 1 and names else None
    data = yaml.safe_load(path.read_text()) if path is not None else None
    if not isinstance(data, dict) or not isinstance(data.get("remote"), dict) or "host" not in data["remote"]:
        return None
    remote = RemoteConfig(**data["remote"])
    return Site(str(data.get("name", names[0])), Login.of(remote), data.get("store")) if remote.host else None


def own_group_files(overrides: Sequence[str]) -> dict[str, str]:
    """The config group files of this machine's own folders that ``overrides`` pick (``data=mine`` from
    ~/.config/hpcdl/data/mine.yaml; each of a sweep's ``data=a,b``), as 'GROUP/NAME.yaml' -> text: the login node
    has none of them. The cluster group is shipped composed (the profile); hpcdl's own groups are there too."""
    from hpcdl.config.compose import config_dirs

    found: dict[str, str] = {}
    for override in overrides:
        group, equals, value = override.lstrip("+").partition("=")
        if not equals or not GROUP_NAME.match(group) or group == "cluster":
            continue
        for name in value.split(","):
            key = f"{group}/{name}.yaml"
            path = next((d / key for d in config_dirs() if GROUP_FILE.match(key) and (d / key).is_file()), None)
            if path is not None:
                found[key] = path.read_text()
    return found


def _send_code(request: dict, folder: Path, names: Sequence[str]) -> Callable[[IO[bytes]], None]:
    def send(stdin: IO[bytes]) -> None:
        stdin.write(json.dumps(request).encode() + b"\n")
        pack(stdin, folder, names)

    return send


def _submit(site: Site, request: dict, names: Sequence[str]) -> tuple[int, dict]:
    """The agent's submit given ``request`` and the files ``names``: its status and its answer."""
    answer: list[bytes] = []
    status, _ = run_agent(site, ["submit"], send=_send_code(request, Path.cwd(), names),
                          read=lambda out: answer.append(out.read()))
    lines = answer[0].decode(errors="replace").strip().splitlines() if answer else []
    return status, json.loads(lines[-1]) if lines else {}


def submit_remote(argv: Sequence[str]) -> Optional[int]:
    """python -m hpcdl.submit ARGV through the login node when its profile is remote; None: it is not."""
    multirun = any(a in ("-m", "--multirun") for a in argv)
    words = [a for a in argv if a not in ("-m", "--multirun")]
    overrides, script_args = (words[:words.index("--")], words[words.index("--") + 1:]) if "--" in words \
        else (words, [])
    picked = [o for o in overrides if is_site_override(o)]
    if not _may_be_remote(picked):
        return None
    from hpcdl.config.compose import compose_config
    from hpcdl.config.secrets import check_secrets_set
    from hpcdl.snapshot import code_files
    from hpcdl.store.folders import store_root

    config = compose_config(picked if multirun else overrides)  # every option checked here, before the login node
    found = _site(config.cluster)
    if found is None:
        return None
    site, profile = found
    wait = not multirun and config.wait
    check_secrets_set(profile["secrets"])
    names = code_files(Path.cwd(), store_root()) if profile["snapshot"] else []
    sent = [o for o in overrides if not is_site_override(o)] + (["wait=false"] if wait else [])
    request = {"profile": profile, "overrides": sent, "script_args": script_args, "multirun": multirun,
               "secrets": {name: os.environ[name] for name in profile["secrets"]}, "groups": own_group_files(sent)}
    files, last = digests(Path.cwd(), names), sent_tree(site)
    changed = [name for name in names if last["files"].get(name) != files[name]]
    status, answer = _submit(site, {**request, "tree": {"key": last["key"], "files": files}}, changed)
    if status == RESEND:  # the login node no longer keeps the last tree whole: everything once more
        status, answer = _submit(site, {**request, "tree": {"key": last["key"], "files": files}}, names)
    job_id = answer.get("id")
    if status == 0:
        remember_sent(site, last["key"], files)
    if job_id:
        remember_job(job_id, site)
        print(f"Submitted {job_id} on {site.login.host}; from here: python -m hpcdl.jobs watch {job_id}")
    if status != 0 or not wait or not job_id:
        return status
    return _follow(site, ["watch", job_id], skip_shown=False)  # followed from here: a dropped connection resumes


def _ask_agent(words: Sequence[str], verb: str, request: Callable[[list[str], dict], dict]) -> Optional[int]:
    """The agent's ``verb`` on the login node of the remote profile ``words`` pick, sent ``request(the other
    words, the profile to run there)`` as one JSON line; None when the profile is not remote."""
    picked = [w for w in words if is_site_override(w)]
    if not _may_be_remote(picked):
        return None
    from hpcdl.config.compose import compose_config

    found = _site(compose_config(picked).cluster)
    if found is None:
        return None
    site, profile = found
    sent = request([w for w in words if not is_site_override(w)], profile)
    return run_agent(site, [verb], send=lambda stdin: stdin.write(json.dumps(sent).encode() + b"\n"))[0]


def check_remote(overrides: Sequence[str]) -> Optional[int]:
    """python -m hpcdl.profiles check on the login node when the profile is remote; None: it is not."""
    return _ask_agent(overrides, "check", lambda rest, profile: {"profile": profile, "overrides": rest,
                                                                  "groups": own_group_files(rest)})


def pool_remote(argv: Sequence[str]) -> Optional[int]:
    """python -m hpcdl.pool ARGV on the login node when its profile is remote (the pool is held from there); None:
    it is not."""
    return _ask_agent(argv, "pool", lambda rest, profile: {"profile": profile, "argv": rest})


def doctor_remote(argv: Sequence[str]) -> Optional[int]:
    """python -m hpcdl.doctor ARGV on the login node when the profile is remote (its allocation is the cluster's,
    its report printed here); None: it is not."""
    return _ask_agent(argv, "doctor", lambda rest, profile: {"profile": profile, "overrides": rest,
                                                              "groups": own_group_files(rest)})


# --- jobs ----------------------------------------------------------------------------------------------------

def jobs_remote(argv: Sequence[str]) -> int:
    """python -m hpcdl.jobs ARGV on the login node: that of ``cluster=NAME``, or of the job's record here (see
    hpcdl.remote.routing.goes_remote)."""
    picked = [a for a in argv if is_site_override(a)]
    rest = [a for a in argv if not is_site_override(a)]
    verb = rest[0] if rest else ""
    if picked:
        site = _site_of_name(picked)
        if site is None:
            from hpcdl.config.compose import compose_config

            found = _site(compose_config(picked).cluster)
            site = found[0] if found else None
    else:
        site = site_of(job_key(rest) or "")
    if site is None:
        raise HpcdlError(f"{' '.join(picked) or job_key(rest)}: not a remote profile or job (no cluster.remote.host); "
                         "the jobs commands take cluster= only to go to a login node")
    if verb == "list":
        return _list(site, rest)
    if verb == "fetch":
        return _fetch(site, rest)
    if verb in ("logs", "watch", "wait"):
        return _follow(site, rest, skip_shown=verb == "logs")
    return run_agent(site, ["jobs", *rest])[0]


def _list(site: Site, argv: Sequence[str]) -> int:
    """The jobs list of the login node, kept; while it is unreachable, the one last seen, marked as such."""
    shown: list[bytes] = []
    try:
        status, _ = run_agent(site, ["jobs", *argv], read=lambda out: shown.append(out.read()))
    except RemoteError as e:
        last = last_listing(site)
        if last is None:
            raise
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last["at"]))
        print(f"note: offline ({e}); the jobs as last seen on {last['host']} at {at}:", file=sys.stderr)
        print(f"# offline: as last seen at {at}")
        print(last["text"], end="")
        return 0
    text = shown[0].decode(errors="replace") if shown else ""
    print(text, end="")
    if status == 0:
        remember_listing(site, text)
    return status


def _follow(site: Site, argv: Sequence[str], skip_shown: bool) -> int:
    """logs/watch/wait on the login node, connecting again when the connection drops (logs: without printing
    again what was shown)."""
    shown = 0

    def read(out: IO[bytes]) -> None:
        nonlocal shown
        seen = 0
        for chunk in iter(lambda: out.read1(65536), b""):
            start = max(0, shown - seen) if skip_shown else 0
            seen += len(chunk)
            if start < len(chunk):
                sys.stdout.buffer.write(chunk[start:])
                sys.stdout.flush()
            shown = max(shown, seen)

    for attempt in range(RECONNECT_TRIES + 1):
        try:
            return run_agent(site, ["jobs", *argv], read=read)[0]
        except RemoteError as e:
            if attempt == RECONNECT_TRIES:
                raise
            print(f"note: {e}; connecting again", file=sys.stderr)
            time.sleep(3)
    raise AssertionError("unreachable")


def _fetch(site: Site, argv: Sequence[str]) -> int:
    """The job's results brought down into --to (default ./ID): whole, or not at all. They come down into a
    private temporary folder (in the user's TMPDIR, never beside --to, where another user may write), then each
    file is copied as the local fetch copies it (store.safety.copy_out: a new file renamed into place) into a
    target that is this user's and no link (open_target): nothing is written through what another user
    planted where --to points."""
    from hpcdl.store.safety import copy_out, open_target

    key = job_key(argv)
    to = argv[argv.index("--to") + 1] if "--to" in argv else key
    target = Path(to).absolute()  # not resolved: a link planted there is refused, not followed
    partial = Path(tempfile.mkdtemp(prefix="hpcdl-fetch-"))
    try:
        status, said = run_agent(site, ["fetch", key, *(["--wait"] if "--wait" in argv else [])],
                                 read=lambda out: _unpack(out, partial), show_stderr=False)
        if status != 0:
            sys.stdout.write(said.replace(FETCHED, str(target)))
            return status
        target_fd = open_target(target)
        try:
            for path in sorted(partial.rglob("*")):
                if path.is_file() and not path.is_symlink():
                    copy_out(partial, path.relative_to(partial), target_fd, target)
        finally:
            os.close(target_fd)
        sys.stdout.write(said.replace(FETCHED, str(target)))
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return 0


def _unpack(stream: IO[bytes], into: Path) -> None:
    if stream.peek(1):  # type: ignore[attr-defined]  # nothing: the fetch failed, and says why on stderr
        unpack(stream, into)
