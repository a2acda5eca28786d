"""mpi4py, loaded without initialising MPI until a job needs it."""

from __future__ import annotations

import atexit
from typing import Any

from hpcdl.errors import ConfigError


def check_mpi_available() -> None:
    """ConfigError unless mpi4py imports and finds an MPI library (MPI is not initialised here)."""
    try:
        import mpi4py

        mpi4py.rc.initialize = False  # importing MPI must not start MPI in a process that only checks
        mpi4py.rc.finalize = False
        from mpi4py import MPI  # noqa: F401 - loads the MPI library
    except ImportError as e:
        raise ConfigError(f"training.comm=mpi: mpi4py or its MPI library is missing ({e}); "
                          "pip install 'hpcdl[mpi]' with an MPI such as Open MPI installed") from e


def world() -> Any:
    """COMM_WORLD, initialising MPI once (one thread at a time calls MPI)."""
    check_mpi_available()
    from mpi4py import MPI

    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_SERIALIZED)
        atexit.register(lambda: MPI.Is_finalized() or MPI.Finalize())  # mpirun wants every rank to finalize
    return MPI.COMM_WORLD
