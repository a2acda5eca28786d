"""Preflight's all-reduce across the allocation: one rank per node times an all-reduce and judges its bus bandwidth.

Once every node has passed its own checks, the nodes' first ranks meet in a process group of their own (NCCL on
GPUs, gloo on CPUs), all-reduce ``cluster.preflight_allreduce_mb`` a few times and work out the bus bandwidth as
nccl-tests does (algbw x 2(n-1)/n). It is flagged when more than BUSBW_LOW under the figure the profile expects
for the device (``cluster.preflight_busbw_gbps``, a table by GPU name part, ``cpu`` for gloo). Each node also
times how long it waited inside the all-reduce: a node whose contribution comes late (a throttled host, a slow
link to its NIC) is the one all the others waited for, and it alone fails the check; a low figure that no node
stands out in is a warning for the whole allocation (the fabric, the network settings), not a node's fault.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from hpcdl.distributed.env import node_index, rendezvous
from hpcdl.distributed.preflight import Check
from hpcdl.distributed.restarts import JobRuns
from hpcdl.store.files import PREFLIGHT, PREFLIGHT_NODE
from hpcdl.store.safety import UnsafeFolderError, read_job_file

BUSBW_LOW = 0.2
"""A bus bandwidth this share under the expected figure is flagged."""
STANDOUT = 0.25
"""A node is the slow one when every other node waited for it at least this share of the timed all-reduces."""
ROUNDS = 5
"""Timed all-reduces (after two untimed ones)."""
JOIN_TIMEOUT_S = 60.0
"""The longest the nodes wait for each other in the all-reduce's process group."""
SLOW_NODE = "HPCDL_PREFLIGHT_SLOW"
"""An injected fault for tests: 'NODE:SECONDS' makes NODE's contribution to each all-reduce that much late."""


@dataclass(frozen=True)
class Timing:
    """One node's view of the timed all-reduces: the bus bandwidth, and each node's wait inside them."""

    busbw_gbps: float
    seconds: float
    """Wall time of the timed all-reduces (the mean of the nodes')."""
    waited: list[float]
    """Per node (by index), seconds spent inside the all-reduces, waiting for the others and moving data."""
    nodes: list[str]
    """The nodes' names, by index."""
    device: str
    """What moved the data: the GPU's name, or cpu."""


def injected_delay(node: str) -> float:
    """Seconds HPCDL_PREFLIGHT_SLOW adds before this node's every contribution (0 when it names another)."""
    name, _, seconds = os.environ.get(SLOW_NODE, "").partition(":")
    return float(seconds) if name == node and seconds else 0.0


def time_allreduce(index: int, nodes: int, address: str, port: int, megabytes: int, node: str,
                   gpu: bool) -> Timing:
    """Join the ``nodes`` nodes' process group at ``address:port`` as ``index`` and time ROUNDS all-reduces of
    ``megabytes`` MB (float32; on this node's first GPU with ``gpu`` and one visible, NCCL; else gloo)."""
    import torch
    import torch.distributed as dist

    cuda = gpu and torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://{address}:{port}", rank=index,
                            world_size=nodes, timeout=datetime.timedelta(seconds=JOIN_TIMEOUT_S),
                            device_id=device if cuda else None)
    try:
        data = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32, device=device)
        delay = injected_delay(node)

        def once() -> float:
            if delay:
                time.sleep(delay)  # this node's share arrives late
            began = time.perf_counter()
            dist.all_reduce(data)
            if cuda:
                torch.cuda.synchronize(device)
            return time.perf_counter() - began

        once(), once()
        started = time.perf_counter()
        waited = sum(once() for _ in range(ROUNDS))
        seconds = time.perf_counter() - started
        gathered = torch.zeros(nodes + 1, dtype=torch.float64, device=device)
        gathered[index], gathered[nodes] = waited, seconds
        dist.all_reduce(gathered)  # each node's wait; the seconds summed, their mean below
        seconds = float(gathered[nodes]) / nodes
        names: list[str] = [""] * nodes
        dist.all_gather_object(names, node)
    finally:
        dist.destroy_process_group()
    algbw = megabytes * 2**20 * ROUNDS / seconds / 1e9
    return Timing(algbw * 2 * (nodes - 1) / nodes, seconds, [float(w) for w in gathered[:nodes].tolist()], names,
                  torch.cuda.get_device_name(device) if cuda else "cpu")


def expected_for(table: dict[str, float], device: str) -> Optional[float]:
    """The expected bus bandwidth for ``device`` (a GPU's name, or cpu) from the profile's table: the entry whose
    key is part of the name (the longest such), None when none is."""
    found = [key for key in table if key.lower() in device.lower()]
    return table[max(found, key=len)] if found else None


def judge(timing: Timing, index: int, expected: Optional[float]) -> tuple[str, str]:
    """(status, detail) of the all-reduce check for node ``index``: failed for the node the others waited for
    when the bandwidth is low, warned for everyone when it is low and no node stands out, else passed."""
    figure = f"all-reduce bus bandwidth {timing.busbw_gbps:.2f} GB/s"
    if expected is None:
        return "passed", f"{figure} (not judged: no expected figure, cluster.preflight_busbw_gbps)"
    if timing.busbw_gbps >= (1 - BUSBW_LOW) * expected:
        return "passed", f"{figure}, expected {expected:g}"
    low = f"{figure}, {1 - timing.busbw_gbps / expected:.0%} under the expected {expected:g}"
    slowest = min(range(len(timing.waited)), key=lambda i: timing.waited[i])
    others = [w - timing.waited[slowest] for i, w in enumerate(timing.waited) if i != slowest]
    if min(others) < STANDOUT * timing.seconds:
        return "warned", f"{low}; no node stands out (the interconnect or cluster.network settings)"
    share = min(others) / timing.seconds
    if index == slowest:
        return "failed", f"{low}; the other nodes waited for this one {share:.0%} of the time"
    return "passed", f"{low}: node {timing.nodes[slowest]} is slow (the others waited for it {share:.0%} of the time)"


def _peers_ready(folder: Path, nodes: int, runs: JobRuns) -> Optional[str]:
    """Wait until every node of this run has written its own checks' result; None then, else why the all-reduce
    is not run (a node failed its checks: it leaves the job; or some did not report within JOIN_TIMEOUT_S)."""
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while True:
        results = []
        for path in (folder / PREFLIGHT).glob(PREFLIGHT_NODE.format(node="*")):
            try:
                result = json.loads(read_job_file(folder, f"{PREFLIGHT}/{path.name}") or b"{}")
            except (OSError, ValueError, UnsafeFolderError):
                continue
            if result.get("slurm_job") == runs.this_job() and result.get("restarts") == runs.this_run():
                results.append(result)
        failed = [r["node"] for r in results if any(c.get("status") == "failed" for c in r.get("checks", []))]
        if failed:
            return f"node {', '.join(sorted(failed))} failed its own checks"
        if len(results) >= nodes:
            return None
        if time.monotonic() > deadline:
            return f"{nodes - len(results)} node(s) did not report within {JOIN_TIMEOUT_S:.0f} s"
        time.sleep(0.2)


def check_allreduce(folder: Path, node: str, nodes: int, megabytes: int, table: dict[str, float],
                    gpu: bool, runs: JobRuns) -> tuple[Check, Optional[Timing]]:
    """This node's all-reduce check and timing, once every node has passed its own checks (skipped on one node,
    where another failed, or when the all-reduce did not complete: a peer's fault is not this node's)."""
    if nodes < 2:
        return Check("allreduce", "skipped", "one node"), None
    waiting = _peers_ready(folder, nodes, runs)
    if waiting is not None:
        return Check("allreduce", "skipped", waiting), None
    index = node_index()
    try:
        address, port = rendezvous(folder, index, f"preflight-{runs.this_job()}-{runs.this_run()}")
        timing = time_allreduce(index, nodes, address, port, megabytes, node, gpu)
    except Exception as e:  # a peer that went away: the job's own start will name it
        return Check("allreduce", "skipped", f"the all-reduce did not complete: {type(e).__name__}: {e}"), None
    status, detail = judge(timing, index, expected_for(table, timing.device))
    return Check("allreduce", status, detail), timing
