"""The profile's remote block: submit from this machine through a cluster's login node over SSH."""

from __future__ import annotations

import re
from dataclasses import field
from typing import List, Optional

from hpcdl.config.fields import check_types, options, require
from hpcdl.config.secrets import check_single_line
from hpcdl.errors import ConfigError

_DESTINATION = re.compile(r"^[A-Za-z0-9_.@:%\[\]-]+$")


@options("cluster.remote")
class RemoteConfig:
    """Where the login node is; null host: this machine submits itself."""

    host: Optional[str] = None
    """SSH destination of the login node (user@host or a Host alias of your ssh config); null: not remote."""
    python: str = "python3"
    """The python on the login node that has the same hpcdl version installed."""
    connect_timeout_s: int = 10
    """Seconds to wait for the login node to answer (ssh's ConnectTimeout), >= 1."""
    persist_s: int = 600
    """Seconds the one authenticated connection stays open after its last use (ssh's ControlPersist), >= 0."""
    ssh_options: List[str] = field(default_factory=list)
    """Further options for ssh, each as -o takes it: [Port=2222, IdentityFile=~/.ssh/cluster]."""

    def __post_init__(self) -> None:
        check_types(self)
        if self.host is not None and (not _DESTINATION.match(self.host) or self.host.startswith("-")):
            raise ConfigError(f"cluster.remote.host: {self.host!r} is not an SSH destination (user@host or a Host "
                              "alias)")
        check_single_line(self.python, "cluster.remote.python")
        require(self, "connect_timeout_s", self.connect_timeout_s >= 1, ">= 1")
        require(self, "persist_s", self.persist_s >= 0, ">= 0")
        for option in self.ssh_options:
            if not re.match(r"^[A-Za-z]+=\S", option) or "\n" in option:
                raise ConfigError(f"cluster.remote.ssh_options: {option!r} is not an ssh -o option (Name=value)")
