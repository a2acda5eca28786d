"""Secrets and hostile names against the real Slurm cluster (slurm/cluster.sh up): a declared secret reaches
every rank by name and no file; names with shell code stay text; newlines and secret values never reach
sbatch."""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
from pathlib import Path

import pytest

import hpcdl
from hpcdl.errors import ConfigError
from tests.conftest import job_folders
from tests.test_slurm import _cli, _queue, slurm_cluster  # noqa: F401 - the fixture

pytestmark = pytest.mark.slurm
SECRET = "hf_" + secrets.token_hex(12)  # made at run time: no file of the code snapshot holds it


def answer() -> int:
    return 42


def token_digest() -> str:
    """Every rank must see HF_TOKEN; rank 0 returns its digest (never the value)."""
    value = os.environ.get("HF_TOKEN")
    if value is None:
        raise RuntimeError(f"rank {os.environ.get('SLURM_PROCID')}: HF_TOKEN did not arrive")
    return hashlib.sha256(value.encode()).hexdigest()


def _job_name(slurm_id: str) -> str:
    """The name the controller holds (sacct's database writes a double quote as a backtick)."""
    shown = subprocess.run(["scontrol", "show", "job", "-o", slurm_id], capture_output=True, text=True,
                           check=True).stdout
    return shown.split(" JobName=", 1)[1].split(" UserId=", 1)[0]


def test_a_declared_secret_reaches_every_slurm_rank_and_no_file(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", SECRET)
    job = hpcdl.batch(token_digest, cluster="slurm", time="00:05:00", nodes=2, secrets=["HF_TOKEN"])
    assert job.result(timeout=240) == hashlib.sha256(SECRET.encode()).hexdigest()
    scripts = list((job.folder / "slurm").glob("*.sh"))
    assert scripts and all("HF_TOKEN" in s.read_text() and "--export=" in s.read_text() for s in scripts)
    assert [p for p in job.folder.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()] == []


def test_a_shell_name_stays_text_on_slurm(store: Path, tmp_path: Path) -> None:
    marker = tmp_path / "shell-ran"
    name = f"$(touch {marker}) `touch {marker}`; touch {marker} 'q\" x"
    job = hpcdl.batch(answer, cluster="slurm", time="00:05:00", name=name)
    assert job.result(timeout=180) == 42
    assert not marker.exists()
    assert _job_name(job.backend_id) == name


@pytest.mark.parametrize("override, message", [
    ("name=a\nb", "LexerNoViableAltException"),
    ("+cluster.network.extra.HF_TOKEN=abc", "cluster.network.extra: HF_TOKEN looks like a secret"),
    (f"+cluster.env.FOO={SECRET}", "cluster.env.FOO: holds the value of HF_TOKEN from this shell"),
    (f"+cluster.sbatch_extra.comment={SECRET}", "cluster.sbatch_extra.comment: holds the value of HF_TOKEN"),
    ("+cluster.sbatch_extra.BAD_KEY=1", "cluster.sbatch_extra: 'BAD_KEY' is not an sbatch option name"),
])
def test_newlines_and_secrets_never_reach_sbatch(store: Path, monkeypatch: pytest.MonkeyPatch, override: str,
                                                 message: str) -> None:
    monkeypatch.setenv("HF_TOKEN", SECRET)
    before = _queue()
    done = _cli("hpcdl.submit", "cluster=slurm", override, check=False)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not _queue() - before and job_folders(store) == []


def test_a_batch_name_with_a_newline_never_reaches_sbatch(store: Path) -> None:
    before = _queue()
    with pytest.raises(ConfigError, match="batch: name: must be a non-empty line without control characters"):
        hpcdl.batch(answer, cluster="slurm", name="x\n#SBATCH --wrap=touch /tmp/pwned")
    assert not _queue() - before and job_folders(store) == []
