"""A real OpenSSH server on 127.0.0.1 for the remote tests: its own config, a throw-away host key and user key,
logging in as a second account (REMOTE_USER) whose store is the "cluster" side."""

from __future__ import annotations

import os
import pwd
import shutil
import site
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[1]
REMOTE_USER = "hpcdlremote"
SSHD = "/usr/sbin/sshd"
SYSTEM_PYTHON = "/usr/bin/python3"


@dataclass
class Server:
    """A running sshd and how a client profile reaches it."""

    port: int
    folder: Path
    python: str
    key: Path
    process: subprocess.Popen
    uid: int

    @property
    def host(self) -> str:
        return f"{REMOTE_USER}@127.0.0.1"

    def ssh_options(self, key: Path | None = None) -> list[str]:
        return [f"Port={self.port}", f"IdentityFile={key or self.key}", "IdentitiesOnly=yes",
                f"UserKnownHostsFile={self.folder / 'known_hosts'}", "StrictHostKeyChecking=yes",
                "GlobalKnownHostsFile=/dev/null"]

    def remote_folder(self, name: str) -> Path:
        """A fresh folder of the remote account's (its store, say)."""
        path = Path(tempfile.mkdtemp(prefix=f"hpcdl-remote-{name}-"))
        os.chmod(path, 0o700)
        os.chown(path, self.uid, self.uid)
        return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def remote_uid() -> int:
    """The remote account's uid (created when missing)."""
    try:
        pwd.getpwnam(REMOTE_USER)
    except KeyError:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", REMOTE_USER], check=True, capture_output=True)
    subprocess.run(["usermod", "-p", "*", REMOTE_USER], check=True, capture_output=True)  # no password, unlocked
    return pwd.getpwnam(REMOTE_USER).pw_uid


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hpcdl-test", "-f", str(path)], check=True)
    return path


def start_sshd(env: dict[str, str]) -> Iterator[Server]:
    """A running sshd whose sessions get ``env`` (SetEnv); stopped and its folder removed afterwards."""
    if os.getuid() != 0 or not Path(SSHD).exists() or shutil.which("ssh") is None:
        pytest.skip("needs root and Debian's openssh-server and openssh-client")
    uid = remote_uid()
    folder = Path(tempfile.mkdtemp(prefix="hpcdl-sshd-", dir="/run"))  # StrictModes refuses keys under /tmp
    os.chmod(folder, 0o755)  # the account reads its authorized keys here
    host_key, key = keygen(folder / "host_key"), keygen(folder / "user_key")
    keys = folder / "authorized"
    keys.mkdir(mode=0o755)
    shutil.copy(key.with_suffix(".pub"), keys / REMOTE_USER)
    os.chmod(keys / REMOTE_USER, 0o644)
    port = _free_port()
    (folder / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key.with_suffix('.pub').read_text()}")
    setenv = " ".join(f'"{name}={value}"' for name, value in env.items())
    (folder / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nPidFile {folder / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {keys}/%u\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
        f"PermitRootLogin no\nAllowUsers {REMOTE_USER}\nStrictModes yes\nLogLevel VERBOSE\n"
        + (f"SetEnv {setenv}\n" if setenv else ""))
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    log = open(folder / "sshd.log", "wb")
    process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(folder / "sshd_config")], stdout=log, stderr=log)
    for _ in range(100):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        if process.poll() is not None:
            raise RuntimeError((folder / "sshd.log").read_text())
        time.sleep(0.05)
    try:
        yield Server(port, folder, remote_python(folder / "venv"), key, process, uid)
    finally:
        process.terminate()
        process.wait(10)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


def remote_python(folder: Path) -> str:
    """A python the remote account may run, with this run's packages (hpcdl from this tree): a venv in
    ``folder`` of the system's python (this run's own may lie where the account cannot read) that adds this
    run's site-packages."""
    if not Path(SYSTEM_PYTHON).exists():
        pytest.skip(f"needs {SYSTEM_PYTHON}")
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(folder)], check=True)
    found = list(folder.glob("lib/python3*/site-packages"))
    ours = [path for path in site.getsitepackages() if Path(path).is_dir()]
    (found[0] / "hpcdl-test.pth").write_text(f"import site; list(map(site.addsitedir, {ours!r}))\n")
    return str(folder / "bin" / "python")
