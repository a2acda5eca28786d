"""Nodes remembered as bad (they failed a preflight of this user's jobs lately) are left out of single jobs and of
sweep arrays alike on the real Slurm cluster (--exclude), recorded in each manifest and shown by jobs show."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcdl.lifecycle.job import Job
from hpcdl.store import badnodes
from tests.test_slurm import _cli, slurm_cluster  # noqa: F401

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

REASON = "node n2 failed preflight: data (the data root /gone is missing on this node)"


def test_a_remembered_bad_node_is_left_out_of_jobs_and_sweep_arrays_and_said_so(store: Path,
                                                                                digits_root: Path) -> None:
    store.mkdir(mode=0o700)
    badnodes.remember(store, "n2", REASON, hold_s=600)
    common = ["cluster=slurm", f"data.root={digits_root}", "training.max_epochs=1", "training.verbose=false",
              "cluster.preflight=on", "cluster.time=00:10:00"]
    job = Job.attach(_cli("hpcdl.submit", *common, "name=excluded-one").stdout.split()[2])
    submitted = _cli("hpcdl.submit", "-m", *common, "name=excluded-sweep", "training.initial_learn_rate=0.1,0.03,0.01")
    sweep = submitted.stdout.split()[2].rstrip(":")
    points = json.loads((store / sweep / "manifest.json").read_text())["points"]
    assert len(points) == 3, submitted.stdout
    array = (store / sweep / "slurm" / "array-0.sh").read_text()
    assert "#SBATCH --exclude=n2" in array, array
    for folder in [job.folder, *(store / point for point in points)]:
        record = Job.attach(folder.name)
        assert record.wait(300) == "COMPLETED", record.error()
        assert json.loads((folder / "manifest.json").read_text())["excluded"] == {"n2": REASON}
        assert [p.name for p in (folder / "preflight-results").iterdir()] == ["n1.preflight.json"]  # ran on n1
        shown = _cli("hpcdl.jobs", "show", folder.name).stdout
        assert f"excluded n2: {REASON}" in shown, shown
