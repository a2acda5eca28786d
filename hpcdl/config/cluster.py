"""cluster: a profile, where a job runs and what it asks the scheduler for (config group cluster/)."""

from __future__ import annotations

import functools
import os
import re
import shutil
from dataclasses import field
from pathlib import Path
from typing import Dict, List, Optional

from hpcdl.config.network import NetworkConfig, refuse_nvls
from hpcdl.config.remote import RemoteConfig
from hpcdl.config.secrets import VARIABLE_NAME, check_single_line, check_variable_names
from hpcdl.errors import ConfigError
from hpcdl.store.pools import check_pool_name
from hpcdl.config.fields import check_types, options, require, require_choice

PROFILES = Path(__file__).resolve().parents[1] / "conf" / "cluster"
"""The cluster config group as packaged: one profile per backend, each naming its backend's module."""
PREFLIGHT_SETTINGS = ("auto", "on", "off")
DEFAULT_EXPORT = ["PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "PYTHONPATH", "VIRTUAL_ENV",
                  "CONDA_PREFIX", "SLURM_CONF", "HPCDL_STORE", "XDG_CACHE_HOME", "OMPI_ALLOW_RUN_AS_ROOT",
                  "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"]
TIME_FORMATS = ("MM", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS")
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_MEMORY = re.compile(r"^\d+[KMGT]?$")


@functools.cache
def backends() -> tuple[str, ...]:
    """The backends' names, as the packaged profiles name them (a backend is the module hpcdl/cluster/<name>.py)."""
    from omegaconf import OmegaConf

    return tuple(sorted({str(OmegaConf.load(path).backend) for path in PROFILES.glob("*.yaml")}))


def time_limit_seconds(text: str) -> int:
    """Slurm's time formats (see TIME_FORMATS) to seconds; ConfigError if malformed."""
    match = _TIME.match(text.strip())
    if not match:
        raise ConfigError(f"cluster.time: {text!r} is not a Slurm time limit; use one of "
                          f"{', '.join(TIME_FORMATS)} (e.g. 90, 01:30:00 or 2-00:00:00)")
    days, a, b, c = match.groups()
    parts = [int(p) for p in (a, b, c) if p is not None]
    if days is not None:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = (parts + [0, 0])[:3]
        total_seconds = ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    elif len(parts) == 3:  # HH:MM:SS
        total_seconds = (parts[0] * 60 + parts[1]) * 60 + parts[2]
    elif len(parts) == 2:  # MM:SS
        total_seconds = parts[0] * 60 + parts[1]
    else:  # MM
        total_seconds = parts[0] * 60
    if total_seconds <= 0:
        raise ConfigError(f"cluster.time: {text!r} must be longer than zero")
    return total_seconds


def time_limit_minutes(text: str) -> int:
    """Slurm's time formats to whole minutes (sbatch's unit), rounded up."""
    return -(-time_limit_seconds(text) // 60)


@options("cluster")
class ClusterConfig:
    """A cluster profile; add your own as one YAML file in ~/.config/hpcdl/cluster/ (or HPCDL_CONFIG_DIR/cluster/)."""

    name: str = "local"
    """Profile name, recorded with every job."""
    backend: str = "local"
    """Where jobs run: local (detached processes on this machine), slurm (sbatch through submitit), or another
    backend that ships a profile in hpcdl/conf/cluster/."""
    store: Optional[str] = None
    """Job store folder (on a filesystem the nodes share); null: $HPCDL_STORE or ~/.hpcdl/jobs."""
    python: Optional[str] = None
    """The python that runs the job on the nodes; null: the interpreter that submits."""
    partition: Optional[str] = None
    """Slurm partition; null: the cluster's default."""
    account: Optional[str] = None
    """Slurm account to charge."""
    qos: Optional[str] = None
    """Slurm quality of service."""
    time: str = "01:00:00"
    """Wall-clock limit in a Slurm format: MM, HH:MM:SS, D-HH:MM:SS, ..."""
    nodes: int = 1
    """Nodes to allocate, >= 1."""
    tasks_per_node: int = 1
    """Tasks (ranks) per node, >= 1."""
    gpus_per_node: int = 0
    """GPUs per node, >= 0."""
    cpus_per_task: Optional[int] = None
    """CPUs per task; null: the scheduler's default."""
    mem: Optional[str] = None
    """Memory per node as Slurm writes it (4000, 16G, 512M); null: the scheduler's default."""
    constraint: Optional[str] = None
    """Slurm node features (--constraint)."""
    sbatch_extra: Dict[str, str] = field(default_factory=dict)
    """Further #SBATCH directives, name without dashes: {exclusive: "", mail-type: END}."""
    setup: List[str] = field(default_factory=list)
    """Shell lines run before the job starts (module load ..., source venv/bin/activate)."""
    env: Dict[str, str] = field(default_factory=dict)
    """Variables set for every rank; shown by dry_run. Names holding TOKEN/KEY/SECRET/PASSWORD are refused."""
    export: List[str] = field(default_factory=lambda: list(DEFAULT_EXPORT))
    """Variables copied from the submitting shell (an allow-list; never the whole environment)."""
    secrets: List[str] = field(default_factory=list)
    """Credentials passed by name from the submitting shell to every rank (WANDB_API_KEY); never written."""
    snapshot: bool = True
    """Copy the submitting folder's code into the job and run from the copy (edits while queued change nothing)."""
    snapshot_limit_mb: int = 50
    """The largest code snapshot, in MB; over it the submission is refused, >= 1."""
    signal_delay_s: int = 120
    """Seconds before the time limit at which the job gets USR2 to checkpoint and stop, >= 0."""
    max_requeues: int = 3
    """Times a training job stopped by USR2 on Slurm requeues itself to go on from its checkpoint, >= 0."""
    network: NetworkConfig = field(default_factory=NetworkConfig)
    """NCCL / InfiniBand / GPUDirect settings for every rank (shown by dry_run)."""
    collective_timeout_s: int = 300
    """A collective that waits longer than this fails the job (a lost rank), >= 10."""
    heartbeat_timeout_s: int = 120
    """A rank of a multi-rank job that sends no heartbeat this long after its first step (stopped, frozen, its
    node lost) fails the job, named in jobs show; 0: no heartbeats, else >= 5."""
    heartbeat_startup_s: int = 900
    """The same before a rank's first step (imports, compiling, the first collective), >= heartbeat_timeout_s."""
    hang_timeout_s: int = 1800
    """A rank of a multi-rank job that reports no step this long while it still heartbeats is hung: every rank's
    Python stack is written to the job folder (jobs why shows the rank the others wait for) and the job fails;
    in the built-in trainer a rank the others wait for in a collective is hung sooner, after 80% of
    collective_timeout_s (20 s under it, at least 15 s), so that it is diagnosed before their collective timeout
    ends the job (validations and checkpoints are not counted); 0: off, else >= 5 (needs heartbeats)."""
    hang_startup_s: int = 3600
    """The same before the first step, for the built-in trainer (user code is watched once it reports a step),
    >= hang_timeout_s."""
    preflight: str = "auto"
    """Each node checks itself before the ranks meet (GPUs, NVML health, Xid events, a bf16 GEMM, HBM, store,
    data root, scratch), then an all-reduce across the nodes: on, off, or auto (on for several nodes and for GPU jobs). On Slurm a failing node is excluded and the
    job queued again once."""
    preflight_allreduce_mb: int = 64
    """Size of the preflight's timed all-reduce across the allocation (one rank per node), in MB, >= 1."""
    preflight_busbw_gbps: Dict[str, float] = field(default_factory=dict)
    """The all-reduce bus bandwidth (GB/s, nccl-tests' busbw) one rank per node must reach across the allocation,
    by device: a GPU name part (H100) or cpu (gloo); more than 20% lower fails the node the others waited for,
    or warns when none stands out. A device not listed: measured and recorded, not judged."""
    preflight_hold_s: int = 86400
    """How long a node that failed a preflight is left out of your later Slurm jobs (sbatch --exclude), in
    seconds; 0: not remembered, >= 0."""
    straggler_margin: float = 0.2
    """jobs show/watch flag a rank whose own time per step (less the wait for its peers) exceeds the median
    rank's by more than this fraction for a whole straggler_window_s, > 0."""
    straggler_window_s: int = 300
    """How long a rank must stay slower than straggler_margin to be flagged; each rank samples its pace ten times
    per window (every 1 to 30 s), >= 5."""
    mpirun: List[str] = field(default_factory=lambda: ["mpirun"])
    """How training.comm=mpi jobs start their ranks inside the allocation (Open MPI's mpirun reads Slurm's)."""
    pool: Optional[str] = None
    """A held pool to run on (python -m hpcdl.pool start): its name or scheduler id. The job runs as a step of the
    pool's allocation, with no queue wait, beside others while they fit; its time must fit in what the pool has
    left. null: a job of its own."""
    remote: RemoteConfig = field(default_factory=RemoteConfig)
    """Submit through a login node over SSH (remote.host set): store and python are then the cluster's."""

    def __post_init__(self) -> None:
        check_types(self)
        require_choice(self, "backend", backends())
        for name in ("nodes", "tasks_per_node"):
            require(self, name, getattr(self, name) >= 1, "a positive integer")
        require(self, "gpus_per_node", self.gpus_per_node >= 0, ">= 0")
        require(self, "cpus_per_task", self.cpus_per_task is None or self.cpus_per_task >= 1,
                "a positive integer or null")
        require(self, "signal_delay_s", self.signal_delay_s >= 0, ">= 0")
        require(self, "max_requeues", self.max_requeues >= 0, ">= 0")
        require(self, "snapshot_limit_mb", self.snapshot_limit_mb >= 1, ">= 1")
        require(self, "mem", self.mem is None or bool(_MEMORY.match(self.mem)),
                "a Slurm memory size such as 4000, 512M or 16G")
        time_limit_minutes(self.time)
        require(self, "collective_timeout_s", self.collective_timeout_s >= 10, ">= 10")
        require(self, "heartbeat_timeout_s", self.heartbeat_timeout_s == 0 or self.heartbeat_timeout_s >= 5,
                "0 (off) or >= 5")
        require(self, "heartbeat_startup_s", self.heartbeat_startup_s >= self.heartbeat_timeout_s,
                f">= heartbeat_timeout_s ({self.heartbeat_timeout_s})")
        require(self, "hang_timeout_s", self.hang_timeout_s == 0 or self.hang_timeout_s >= 5, "0 (off) or >= 5")
        require(self, "hang_startup_s", self.hang_startup_s >= self.hang_timeout_s,
                f">= hang_timeout_s ({self.hang_timeout_s})")
        require_choice(self, "preflight", PREFLIGHT_SETTINGS)
        require(self, "preflight_hold_s", self.preflight_hold_s >= 0, ">= 0")
        require(self, "preflight_allreduce_mb", self.preflight_allreduce_mb >= 1, ">= 1")
        require(self, "preflight_busbw_gbps", all(v > 0 for v in self.preflight_busbw_gbps.values()),
                "a table of device name part to GB/s > 0, e.g. {H100: 40}")
        require(self, "straggler_margin", self.straggler_margin > 0, "> 0")
        require(self, "straggler_window_s", self.straggler_window_s >= 5, ">= 5")
        require(self, "mpirun", len(self.mpirun) > 0, "a command, e.g. [mpirun, --bind-to, none]")
        check_variable_names(self.env, "cluster.env")
        check_variable_names(self.export, "cluster.export")
        for name in self.secrets:
            if not VARIABLE_NAME.match(name):
                raise ConfigError(f"cluster.secrets: {name!r} is not a variable name")
            if name in self.env:
                raise ConfigError(f"cluster.secrets: {name} is also set in cluster.env; a secret's value comes "
                                  "from the submitting shell only")
        for name in ("name", "partition", "account", "qos", "constraint", "mem"):  # they reach #SBATCH lines
            check_single_line(getattr(self, name), f"cluster.{name}")
        for key, value in self.sbatch_extra.items():
            if not re.match(r"^[a-z][a-z0-9-]*$", key):
                raise ConfigError(f"cluster.sbatch_extra: {key!r} is not an sbatch option name (mail-type, ...)")
            check_single_line(value, f"cluster.sbatch_extra.{key}")
        refuse_nvls(self.env, "cluster.env")
        if self.pool is not None and not self.pool.isdigit():
            check_pool_name(self.pool, "cluster.pool")
        if self.remote.host is None and self.python is not None and shutil.which(os.path.expanduser(self.python)) is None:
            raise ConfigError(f"cluster.python: {self.python!r} is not an executable python on this machine")
