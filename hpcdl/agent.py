"""python -m hpcdl.agent: what a remote client runs on the login node over SSH (not a command for people).

    python -m hpcdl.agent --expect VERSION submit        # stdin: one JSON line, then a tar of the code
    python -m hpcdl.agent --expect VERSION jobs VERB ... # python -m hpcdl.jobs VERB ... here
    python -m hpcdl.agent --expect VERSION fetch ID [--wait]  # the fetched results as a tar on stdout
    python -m hpcdl.agent --expect VERSION check         # stdin: one JSON line; python -m hpcdl.profiles check
    python -m hpcdl.agent --expect VERSION doctor        # stdin: one JSON line; python -m hpcdl.doctor
    python -m hpcdl.agent --expect VERSION pool          # stdin: one JSON line; python -m hpcdl.pool here

Submitting, it runs hpcdl.submit here with the client's composed profile, from the code it was sent, and writes
the job's id as JSON on stdout (what hpcdl.submit prints goes to stderr).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from hpcdl.errors import HpcdlError
from hpcdl.remote.protocol import FETCHED, GROUP_FILE, RESEND, WRONG_VERSION, hpcdl_version
from hpcdl.remote.transfer import fill_from, keep, pack_tree, unpack

SUBMITTED = re.compile(r"^Submitted (?:job|sweep) (\S+?):? ", re.MULTILINE)
"""The id in what hpcdl.submit prints (a job's or a sweep's first line)."""
PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
TREE_KEY = re.compile(r"^[0-9a-f]{32}$")
"""A client's key for the code tree kept here for it (see hpcdl.remote.records.sent_tree)."""


STALE_AFTER_S = 86400
"""An incoming folder this old was left by an agent that was killed (a cut transfer cleans up after itself)."""


def _work_folder() -> Path:
    """This user's private folder for what a client sends ($XDG_CACHE_HOME/hpcdl/remote, created 0700), without
    the incoming folders of agents killed long ago."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folder = base / "hpcdl" / "remote"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    for left in folder.glob(".incoming-*"):
        with contextlib.suppress(OSError):
            if time.time() - left.lstat().st_mtime > STALE_AFTER_S:
                shutil.rmtree(left)
    return folder


@contextlib.contextmanager
def _as_profile(profile: dict[str, Any], groups: Any = None) -> Iterator[tuple[str, Path]]:
    """The client's composed profile as a profile here, found first by its name, with the group files of the
    client's own that its overrides pick ('data/mine.yaml' -> text); (name, a private work folder)."""
    name = profile.get("name") if PROFILE_NAME.match(str(profile.get("name"))) else "remote"
    groups = groups or {}
    for key, text in groups.items() if isinstance(groups, dict) else [("", None)]:
        found = GROUP_FILE.match(key)
        if found is None or found.group(1) == "cluster" or not isinstance(text, str):
            raise HpcdlError(f"the client sent a config group file {key!r}: only GROUP/NAME.yaml (not cluster) "
                             "is taken")
    work = Path(tempfile.mkdtemp(prefix=".incoming-", dir=_work_folder()))
    try:
        (work / "config" / "cluster").mkdir(parents=True)
        (work / "config" / "cluster" / f"{name}.yaml").write_text(json.dumps(profile))
        for key, text in groups.items():
            (work / "config" / key).parent.mkdir(exist_ok=True)
            (work / "config" / key).write_text(text)
        os.environ["HPCDL_CONFIG_DIR"] = str(work / "config")
        yield name, work
    finally:
        os.chdir(Path.home())
        shutil.rmtree(work, ignore_errors=True)


def submit(stdin: BinaryIO) -> int:
    """Submit what the client sent: its profile as this run's profile, its overrides, from its code."""
    request = json.loads(stdin.readline())
    with _as_profile(request["profile"], request.get("groups")) as (name, work):
        code = work / "code"
        code.mkdir()
        unpack(stdin, code)  # whole before anything runs: a cut transfer submits nothing
        tree = request.get("tree") or {}
        kept = _work_folder() / f"tree-{tree['key']}" if TREE_KEY.match(str(tree.get("key"))) else None
        if kept is not None and (missing := fill_from(kept, code, tree["files"])):
            print(json.dumps({"status": RESEND, "missing": missing}))  # the client sends every file again
            return RESEND
        os.environ.update(request.get("secrets") or {})  # passed to the job by name, never written
        os.chdir(code)
        argv = [*(["-m"] if request.get("multirun") else []), f"cluster={name}", *request["overrides"],
                *(["--", *request["script_args"]] if request.get("script_args") else [])]
        from hpcdl.submit import main

        said = io.StringIO()
        with contextlib.redirect_stdout(said):
            code_of_submit = main(argv)
        sys.stderr.write(said.getvalue())
        found = SUBMITTED.search(said.getvalue())
        print(json.dumps({"status": code_of_submit, "id": found.group(1) if found else None}))
        if kept is not None and code_of_submit == 0:
            os.chdir(work)
            keep(code, kept)
        return code_of_submit


def with_profile(verb: str, stdin: BinaryIO) -> int:
    """python -m hpcdl.profiles check (``verb`` check) or python -m hpcdl.doctor (doctor), here, of the client's
    profile with its other arguments."""
    request = json.loads(stdin.readline())
    with _as_profile(request["profile"], request.get("groups")) as (name, _):
        if verb == "check":
            from hpcdl.profiles import main

            return main(["check", name, *request["overrides"]])
        from hpcdl.doctor import main as doctor

        return doctor([f"cluster={name}", *request["overrides"]])


def pool(stdin: BinaryIO) -> int:
    """python -m hpcdl.pool, here, with the client's profile: its verb, then cluster=PROFILE, then the rest (a
    pool stop's NAME first)."""
    request = json.loads(stdin.readline())
    argv = [str(word) for word in request.get("argv") or []]
    with _as_profile(request["profile"]) as (name, _):
        from hpcdl.pool import main

        head = 2 if argv[:1] == ["stop"] else 1
        return main([*argv[:head], f"cluster={name}", *argv[head:]])


def fetch(job: str, wait: bool) -> int:
    """``jobs fetch`` into a private temporary folder, sent as a tar on stdout (what it prints: on stderr)."""
    from hpcdl.jobs import main
    from hpcdl.store.safety import check_job_key

    check_job_key(job)
    with tempfile.TemporaryDirectory(dir=_work_folder()) as work:
        target = Path(work, job)
        said = io.StringIO()
        with contextlib.redirect_stdout(said):
            status = main(["fetch", job, "--to", str(target), *(["--wait"] if wait else [])])
        sys.stderr.write(said.getvalue().replace(str(target), FETCHED))
        if status == 0:
            sys.stderr.flush()
            pack_tree(sys.stdout.buffer, target)
        return status


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "--expect":
        print(__doc__, file=sys.stderr)
        return 2
    if argv[1] != hpcdl_version():
        print(f"hpcdl {hpcdl_version()} on {os.uname().nodename} ({sys.executable}); the client has {argv[1]}",
              file=sys.stderr)
        return WRONG_VERSION
    verb, rest = argv[2], argv[3:]
    try:
        return _run(verb, rest)
    except (HpcdlError, tarfile.TarError, EOFError) as e:  # a transfer cut short, a refused file: nothing was kept
        print(f"error: {verb} on {os.uname().nodename}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


def _run(verb: str, rest: list[str]) -> int:
    if verb == "submit":
        return submit(sys.stdin.buffer)
    if verb == "jobs":
        from hpcdl.jobs import main as jobs

        return jobs(rest)
    if verb == "fetch":
        return fetch(rest[0], "--wait" in rest[1:])
    if verb in ("check", "doctor"):
        return with_profile(verb, sys.stdin.buffer)
    if verb == "pool":
        return pool(sys.stdin.buffer)
    print(f"unknown verb {verb!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
