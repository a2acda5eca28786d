"""Where a job runs: one small interface (check, preview, submit, live_states, cancel, log_path),
one module per backend."""

from __future__ import annotations

from typing import Union

from hpcdl.cluster.local import LocalBackend
from hpcdl.cluster.slurm import SlurmBackend

Backend = Union[LocalBackend, SlurmBackend]
BACKENDS = {"local": LocalBackend, "slurm": SlurmBackend}


def backend_for(name: str) -> Backend:
    """The backend a profile's ``backend`` names."""
    return BACKENDS[name]()
