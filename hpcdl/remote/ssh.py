"""One authenticated SSH connection to a login node, reused: the system's OpenSSH client with a control master.

The control socket lies in a folder of this user's alone that hpcdl creates ($XDG_RUNTIME_DIR/hpcdl-ssh, else
the temporary folder's hpcdl-ssh-UID); nothing is written into ~/.ssh or a shell start-up file. The master is
started once (the user's ssh config, agent, ProxyJump and prompts apply); every command after it runs in
BatchMode over the master, so it never asks again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from hpcdl.errors import HpcdlError

SSH_FAILED = 255
"""ssh's own exit status when the connection (not the remote command) failed."""


class RemoteError(HpcdlError):
    """The login node cannot be reached or used: what failed and what to do about it."""


@dataclass(frozen=True)
class Login:
    """Where and how to reach a login node (a profile's cluster.remote block, as plain values)."""

    host: str
    python: str = "python3"
    connect_timeout_s: int = 10
    persist_s: int = 600
    ssh_options: tuple[str, ...] = ()

    @classmethod
    def of(cls, remote: Any) -> "Login":
        """The login of a RemoteConfig (or a dict of its fields, as a client record keeps it)."""
        values = remote if isinstance(remote, Mapping) else vars(remote)
        return cls(host=values["host"], python=values["python"], connect_timeout_s=values["connect_timeout_s"],
                   persist_s=values["persist_s"], ssh_options=tuple(values["ssh_options"]))

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "python": self.python, "connect_timeout_s": self.connect_timeout_s,
                "persist_s": self.persist_s, "ssh_options": list(self.ssh_options)}


def control_folder() -> Path:
    """This user's private folder of control sockets (created 0700); RemoteError if another could use it."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    folder = Path(runtime, "hpcdl-ssh") if runtime else Path(tempfile.gettempdir(), f"hpcdl-ssh-{os.getuid()}")
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(folder)
    except OSError as e:
        raise RemoteError(f"cannot make the folder of ssh control sockets {folder}: {e.strerror or e}") from e
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise RemoteError(f"{folder}: not a folder of this user's alone (owner uid {info.st_uid}, mode "
                          f"{stat.S_IMODE(info.st_mode):o}); remove it, hpcdl makes it again")
    return folder


def control_socket(login: Login) -> Path:
    """The control socket of ``login``'s master connection (one per destination and options)."""
    key = hashlib.sha256(json.dumps(login.to_dict(), sort_keys=True).encode()).hexdigest()[:16]
    return control_folder() / key


def _options(login: Login) -> list[str]:
    options = [f"ControlPath={control_socket(login)}", f"ConnectTimeout={login.connect_timeout_s}",
               "ServerAliveInterval=15", "ServerAliveCountMax=3", *login.ssh_options]
    return [part for option in options for part in ("-o", option)]


def _explain(login: Login, stderr: str) -> str:
    """What ssh's failure means for the user, in one message."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip() and not line.startswith("Warning:")]
    said = lines[-1] if lines else "no message from ssh"
    host = login.host
    if "Permission denied" in stderr or "Too many authentication failures" in stderr:
        return (f"{host} refused the login ({said}); check that `ssh {host}` logs in with your key or agent "
                "(cluster.remote.ssh_options may name an IdentityFile)")
    if "Host key verification failed" in stderr or "REMOTE HOST IDENTIFICATION HAS CHANGED" in stderr:
        return f"{host}: its host key is unknown or changed ({said}); connect once with `ssh {host}` to check it"
    if any(text in stderr for text in ("Connection refused", "timed out", "Could not resolve", "No route to host",
                                       "Network is unreachable", "Connection closed", "Name or service not known")):
        return (f"cannot reach the login node {host} ({said}; cluster.remote.connect_timeout_s="
                f"{login.connect_timeout_s})")
    return f"ssh to {host} failed: {said}"


def is_connected(login: Login) -> bool:
    """Whether a master connection to ``login`` is up."""
    check = subprocess.run(["ssh", *_options(login), "-O", "check", "--", login.host], capture_output=True,
                           stdin=subprocess.DEVNULL, timeout=login.connect_timeout_s + 5)
    return check.returncode == 0


def connect(login: Login) -> None:
    """Start the master connection unless one is up; RemoteError saying why it failed (nothing is left then).

    With a terminal, ssh may ask (a password, a one-time code) once; without one it fails rather than wait.
    """
    if is_connected(login):
        return
    control_socket(login).unlink(missing_ok=True)  # a killed master's socket would turn multiplexing off
    interactive = sys.stdin.isatty()
    command = ["ssh", *_options(login), "-o", "ControlMaster=yes", "-o", f"ControlPersist={login.persist_s}",
               "-o", f"BatchMode={'no' if interactive else 'yes'}", "-N", "-f", "--", login.host]
    with tempfile.TemporaryFile() as said:  # not a pipe: the master, once in the background, keeps its stderr
        try:
            started = subprocess.run(command, stdin=None if interactive else subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=said, start_new_session=not interactive,
                                     timeout=None if interactive else login.connect_timeout_s + 10)
        except subprocess.TimeoutExpired as e:
            raise RemoteError(f"cannot reach the login node {login.host}: no answer in "
                              f"{login.connect_timeout_s + 10} s") from e
        except FileNotFoundError as e:
            raise RemoteError("no ssh client on this machine: install OpenSSH (openssh-client)") from e
        said.seek(0)
        stderr = said.read().decode(errors="replace")
    if started.returncode != 0:
        raise RemoteError(_explain(login, stderr))


def disconnect(login: Login) -> None:
    """Close the master connection, if one is up."""
    subprocess.run(["ssh", *_options(login), "-O", "exit", "--", login.host], capture_output=True,
                   stdin=subprocess.DEVNULL, timeout=login.connect_timeout_s + 5)


def remote_command(login: Login, argv: Sequence[str], env: Mapping[str, str] = {}) -> list[str]:
    """The local command that runs ``argv`` (with ``env``) on the login node over the master, every word quoted
    (a leading ~/ left for the login node's shell to expand)."""
    words = ["env", *(f"{name}={value}" for name, value in env.items()), *argv] if env else list(argv)
    quoted = " ".join("~/" + shlex.quote(word[2:]) if word.startswith("~/") else shlex.quote(word) for word in words)
    return ["ssh", *_options(login), "-o", "ControlMaster=no", "-o", "BatchMode=yes", "-T", "--", login.host, quoted]


def run(login: Login, argv: Sequence[str], env: Mapping[str, str] = {}, **kwargs: Any) -> subprocess.CompletedProcess:
    """Run ``argv`` on the login node (connecting first); RemoteError when the connection, not the command,
    failed. ``kwargs`` go to subprocess.run (input, stdout, ...)."""
    connect(login)
    kwargs.setdefault("stderr", subprocess.PIPE)
    done = subprocess.run(remote_command(login, argv, env), **kwargs)
    if done.returncode == SSH_FAILED:
        stderr = done.stderr.decode(errors="replace") if isinstance(done.stderr, bytes) else (done.stderr or "")
        raise RemoteError(_explain(login, stderr))
    return done
