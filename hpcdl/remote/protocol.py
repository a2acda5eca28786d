"""What the client and ``python -m hpcdl.agent`` on the login node agree on: the version, exit codes, the module."""

from __future__ import annotations

import functools
import importlib.metadata
import re

AGENT = "hpcdl.agent"
"""The module the client runs on the login node (python -m hpcdl.agent --expect VERSION VERB ...)."""
FETCHED = "{fetched}"
"""What the agent's fetch text says in place of its own temporary folder (the client puts its target there)."""
GROUP_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
"""A config group's name (data, model, training, ...), and its options' names but that they may start with a digit."""
GROUP_FILE = re.compile(r"^([A-Za-z][A-Za-z0-9_]*)/([A-Za-z0-9][A-Za-z0-9_-]*)\.yaml$")
"""A group file the client ships with a submission ('GROUP/NAME.yaml': no other path is accepted)."""
RESEND = 4
"""The agent's submit status when files the client did not send again are not kept there: send every file."""
WRONG_VERSION = 3
"""The agent's exit status when its hpcdl is not the client's version (it says which it has on stderr)."""


@functools.cache
def hpcdl_version() -> str:
    """This installation's hpcdl version."""
    try:
        return importlib.metadata.version("hpcdl")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def install_hint(python: str, host: str) -> str:
    """How to install this version of hpcdl for ``python`` on ``host``."""
    return (f"install the same version there: ssh {host} {python} -m pip install --user 'hpcdl=={hpcdl_version()}' "
            "(or point cluster.remote.python at a python that has it)")
