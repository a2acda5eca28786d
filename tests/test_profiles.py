"""Site profiles: an admin's folder below the user's own; python -m hpcdl.profiles lists them and checks one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpcdl.config.compose import compose_config


@pytest.fixture
def folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    site, user = tmp_path / "site", tmp_path / "user"
    for folder in (site, user):
        (folder / "cluster").mkdir(parents=True)
    (site / "cluster" / "gpu.yaml").write_text("name: gpu\nbackend: slurm\npartition: gpu\n")
    (site / "cluster" / "shared.yaml").write_text("name: shared-of-the-site\n")
    (user / "cluster" / "shared.yaml").write_text("name: shared-of-mine\n")
    monkeypatch.setenv("HPCDL_SITE_DIR", str(site))
    monkeypatch.setenv("HPCDL_CONFIG_DIR", str(user))
    return site, user


def test_a_site_profile_is_found_by_name_below_the_users_own(folders: tuple[Path, Path]) -> None:
    assert compose_config(["cluster=gpu"]).cluster.partition == "gpu"
    assert compose_config(["cluster=shared"]).cluster.name == "shared-of-mine"


def test_profiles_list_names_each_profile_where_it_comes_from_and_what_it_hides(folders: tuple[Path, Path]) -> None:
    site, user = folders
    listed = subprocess.run([sys.executable, "-m", "hpcdl.profiles", "list"], capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert set(rows) == {"gpu", "shared", "local", "slurm", "spawn"}
    assert "site" in rows["gpu"] and str(site / "cluster" / "gpu.yaml") in rows["gpu"]
    assert "yours (hides site)" in rows["shared"] and str(user / "cluster" / "shared.yaml") in rows["shared"]
    assert "built in" in rows["local"]


def test_profiles_check_of_the_local_profile_says_what_this_machine_offers(folders: tuple[Path, Path]) -> None:
    checked = subprocess.run([sys.executable, "-m", "hpcdl.profiles", "check", "local"], capture_output=True,
                             text=True)
    assert checked.returncode == 0, checked.stderr
    assert "this machine" in checked.stdout and "CPUs" in checked.stdout
    assert "network   HPCDL_COLLECTIVE_TIMEOUT_S=300 NCCL_NVLS_ENABLE=0" in checked.stdout
    assert checked.stdout.rstrip().endswith("ok: the cluster can run what profile local asks for")


def test_profiles_check_names_a_bad_option_before_asking_anything(folders: tuple[Path, Path]) -> None:
    checked = subprocess.run([sys.executable, "-m", "hpcdl.profiles", "check", "local", "cluster.nodes=0"],
                             capture_output=True, text=True)
    assert checked.returncode == 1 and "cluster.nodes: must be a positive integer" in checked.stderr
