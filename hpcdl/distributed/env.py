"""Rank discovery: who am I, how many are we, where is rank 0, from the environment a job lands in.

Sources, in order: torchrun's variables (also set by hpcdl's local launcher), MPI
(mpirun sets OMPI_COMM_WORLD_* / PMI_*; the master address is broadcast from rank
0 over MPI), Slurm tasks (SLURM_PROCID...). Under Slurm the master is found by a
rendezvous file in the job folder that rank 0 writes with its own address and a
free port, so it is right wherever rank 0 lands (pytorch#137402) and whatever
ntasks-per-node is (Lightning#20391); node names need not resolve.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hpcdl.store.atomic import atomic_write_text
from hpcdl.store.files import RENDEZVOUS
from hpcdl.errors import HpcdlError

RENDEZVOUS_TIMEOUT_S = 300.0
MPI_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
LAUNCHER_RANK_VARIABLES = ("RANK", *MPI_RANK_VARIABLES)
"""Set in a rank that a launcher started (hpcdl's, torchrun, mpirun); SLURM_PROCID is set by srun too."""


def global_rank() -> int:
    """This process's rank by discover's precedence (torchrun, then MPI, then Slurm), without a rendezvous."""
    for name in (*LAUNCHER_RANK_VARIABLES, "SLURM_PROCID"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    source: str
    """torchrun, mpi, slurm or single."""


def node_name() -> str:
    """This rank's node as the scheduler names it (Slurm's node name), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def free_port() -> int:
    """A TCP port free on this host now (bound by the OS, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def own_address() -> str:
    """An address of this host the other nodes can reach: Slurm's NodeAddr, else the hostname's."""
    node = os.environ.get("SLURMD_NODENAME")
    if node:
        try:
            line = subprocess.run(["scontrol", "show", "node", "-o", node], capture_output=True, text=True,
                                  timeout=30).stdout
            for field in line.split():
                if field.startswith("NodeAddr="):
                    return socket.gethostbyname(field.split("=", 1)[1])
        except (OSError, subprocess.TimeoutExpired, socket.gaierror):
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except socket.gaierror:
        return "127.0.0.1"


def rendezvous(folder: Path, rank: int, key: str) -> tuple[str, int]:
    """Rank 0 publishes its address and a free port in ``folder``; the others wait for it."""
    path = folder / RENDEZVOUS.format(key=key)
    if rank == 0:
        address = {"addr": own_address(), "port": free_port()}
        atomic_write_text(path, json.dumps(address))
        return address["addr"], address["port"]
    deadline = time.monotonic() + RENDEZVOUS_TIMEOUT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise HpcdlError(f"rank {rank}: rank 0 did not publish {path} within {RENDEZVOUS_TIMEOUT_S:.0f} s")
        time.sleep(0.1)
    address = json.loads(path.read_text())
    return address["addr"], int(address["port"])


def discover(job_folder: Optional[Path] = None) -> DistEnv:
    """This process's rank, world and master, from torchrun, MPI or Slurm variables (else a single process)."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return DistEnv(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)),
                       int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])), env.get("MASTER_ADDR", "127.0.0.1"),
                       int(env.get("MASTER_PORT", 29500)), "torchrun")
    if any(name in env for name in MPI_RANK_VARIABLES):
        from mpi4py import MPI

        from hpcdl.distributed.mpi import world

        comm = world()
        address = comm.bcast({"addr": own_address(), "port": free_port()} if comm.rank == 0 else None, root=0)
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)  # the ranks of this node
        return DistEnv(comm.rank, comm.size, local.rank, local.size, address["addr"], address["port"], "mpi")
    if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
        rank, world_size = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
        folder = job_folder or Path(env.get("HPCDL_JOB_FOLDER", "."))
        key = f"{env.get('SLURM_JOB_ID', '0')}-{env.get('SLURM_STEP_ID', '0')}-{env.get('SLURM_RESTART_COUNT', '0')}"
        addr, port = rendezvous(folder, rank, key)
        return DistEnv(rank, world_size, int(env.get("SLURM_LOCALID", 0)), _tasks_on_this_node(env), addr, port,
                       "slurm")
    return DistEnv(0, 1, 0, 1, "127.0.0.1", 0, "single")


def _tasks_on_this_node(env: os._Environ) -> int:
    """SLURM_STEP_TASKS_PER_NODE ('2(x3),1') for this node's index."""
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if not spec:
        return 1
    counts: list[int] = []
    for part in spec.split(","):
        if "(x" in part:
            value, repeat = part.split("(x")
            counts += [int(value)] * int(repeat.rstrip(")"))
        else:
            counts.append(int(part))
    node = node_index()
    return counts[node] if node < len(counts) else counts[-1]


def node_index() -> int:
    """This node's index among the job's nodes (srun's SLURM_NODEID), 0 where the launcher gives none."""
    return int(os.environ.get("SLURM_NODEID", 0))


def local_env() -> DistEnv:
    """Local rank and size without any rendezvous (for choosing a device before joining)."""
    e = os.environ
    for rank_var, size_var in (("LOCAL_RANK", "LOCAL_WORLD_SIZE"), ("OMPI_COMM_WORLD_LOCAL_RANK",
                                                                      "OMPI_COMM_WORLD_LOCAL_SIZE"),
                               ("SLURM_LOCALID", "SLURM_NTASKS_PER_NODE")):
        if rank_var in e:
            return DistEnv(0, 1, int(e[rank_var]), int(e.get(size_var, "1").split("(")[0]), "", 0, "local")
    return DistEnv(0, 1, 0, 1, "", 0, "single")
