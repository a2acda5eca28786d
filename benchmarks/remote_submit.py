"""Remote submission through a loopback sshd against hpcdl on the login node itself (issue 26's targets).

Starts Debian's sshd on 127.0.0.1 (tests/sshd.py: a throw-away host key and user key, a second account as the
login node's user) and times, each in a fresh client process as a user types it:
- submit to the prompt of a one-line script job on the test Slurm cluster, with the first connection (a new
  runtime folder each time: ssh connects and authenticates) and over the connection kept from before;
- the same submission by hpcdl on the login node (no SSH);
- jobs list of 1,000 ended jobs in the login node's store, remote (connection kept) and on the login node.
Medians are compared as ratios remote / on the login node. Needs root, openssh-server and the test cluster.

    python benchmarks/remote_submit.py [--repeats 5] [--jobs 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common import write_result  # noqa: E402  benchmarks/common.py
from jobs_list import make_store  # noqa: E402  benchmarks/jobs_list.py
from tests.sshd import start_sshd  # noqa: E402


def timed(command: list[str], env: dict[str, str], cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr}")
    return seconds


def profile(conf: Path, name: str, store: Path, remote: dict | None) -> None:
    (conf / "cluster").mkdir(parents=True, exist_ok=True)
    (conf / "cluster" / f"{name}.yaml").write_text(json.dumps(
        {"name": name, "backend": "slurm", "store": str(store), "time": "00:05:00",
         **({"remote": remote} if remote else {})}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--out", default="benchmarks/results/remote_submit.json")
    options = parser.parse_args()
    submit = [sys.executable, "-m", "hpcdl.submit", "script=job.py"]
    listing = [sys.executable, "-m", "hpcdl.jobs", "list"]
    times: dict[str, list[float]] = {"remote_first_connection": [], "remote_connected": [], "login_node": [],
                                     "list_remote": [], "list_login_node": []}
    slurm_conf = os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")
    scratch = Path(tempfile.mkdtemp(prefix="hpcdl-bench-remote-"))
    for server in start_sshd({"SLURM_CONF": slurm_conf}):
        try:
            conf = scratch / "conf"
            project = scratch / "project"
            project.mkdir()
            (project / "job.py").write_text("print('hello')\n")
            remote = {"host": server.host, "python": server.python, "ssh_options": server.ssh_options()}
            remote_store, remote_many = server.remote_folder("store"), server.remote_folder("many")
            profile(conf, "site", remote_store, remote)
            profile(conf, "many", remote_many / "jobs", remote)
            profile(conf, "here", scratch / "here", None)
            make_store(remote_many / "jobs", options.jobs)
            subprocess.run(["chown", "-R", f"{server.uid}:{server.uid}", str(remote_many)], check=True)
            make_store(scratch / "many-here", options.jobs)
            env = {**os.environ, "HPCDL_CONFIG_DIR": str(conf), "HPCDL_STORE": str(scratch / "client")}
            kept = {**env, "XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="hb", dir="/tmp")}
            timed([*listing, "cluster=many"], kept, project)  # connects, and the login node's index is written
            timed(listing, {**env, "HPCDL_STORE": str(scratch / "many-here")}, project)
            for n in range(options.repeats):
                fresh = {**env, "XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="hf", dir="/tmp")}
                times["remote_first_connection"].append(timed([*submit, "cluster=site"], fresh, project))
                subprocess.run(["ssh", "-o", f"ControlPath={next(Path(fresh['XDG_RUNTIME_DIR'], 'hpcdl-ssh').iterdir())}",
                                "-O", "exit", "x"], capture_output=True)
                times["remote_connected"].append(timed([*submit, "cluster=site"], kept, project))
                times["login_node"].append(timed([*submit, "cluster=here"], env, project))
                times["list_remote"].append(timed([*listing, "cluster=many"], kept, project))
                times["list_login_node"].append(timed(listing, {**env, "HPCDL_STORE": str(scratch / "many-here")},
                                                      project))
            for socket in Path(kept["XDG_RUNTIME_DIR"], "hpcdl-ssh").iterdir():
                subprocess.run(["ssh", "-o", f"ControlPath={socket}", "-O", "exit", "x"], capture_output=True)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    medians = {name: statistics.median(values) for name, values in times.items()}
    result = {"benchmark": "remote_submit", "repeats": options.repeats, "jobs_listed": options.jobs,
              "load_average": os.getloadavg(), "cpus": os.cpu_count(),
              "seconds": times, "median_s": medians,
              "ratio_submit_first_connection": medians["remote_first_connection"] / medians["login_node"],
              "ratio_submit_connected": medians["remote_connected"] / medians["login_node"],
              "ratio_list": medians["list_remote"] / medians["list_login_node"]}
    for name, value in medians.items():
        print(f"{name:24s} {value:6.3f} s")
    print(f"ratio remote/login node: submit first connection {result['ratio_submit_first_connection']:.2f}, "
          f"connected {result['ratio_submit_connected']:.2f}, jobs list of {options.jobs} {result['ratio_list']:.2f}")
    write_result(options.out, result)


if __name__ == "__main__":
    main()
