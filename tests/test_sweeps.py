"""Sweeps on the local profile: Hydra's own launcher test suites with hydra/launcher=hpcdl, hpcdl.submit -m,
the sweep's record, summary and cancel, and bad input refused before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite

WAIT = ["hydra.launcher.wait=true", "hydra.launcher.poll_s=0.2"]


@pytest.fixture(autouse=True)
def _own_store(store: Path) -> Path:
    return store


@pytest.mark.parametrize("launcher_name, overrides", [("hpcdl", [*WAIT, "hydra.job.chdir=True"])])
class TestHpcdlLauncher(LauncherTestSuite):
    """Hydra's launcher suite: every point runs as a local hpcdl job, its JobReturn read back from the store."""


@pytest.mark.parametrize("task_launcher_cfg, extra_flags", [({}, ["-m", "hydra/launcher=hpcdl", *WAIT])])
class TestHpcdlLauncherIntegration(IntegrationTestSuite):
    """Hydra's integration suite: apps in their own process, run through the launcher."""
