"""Shared fixtures: real image files, small tensor problems."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
LEFT_OUT = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache", "runs")


@pytest.fixture(autouse=True)
def process_as_found() -> Iterator[None]:
    """Each test starts in the folder and with the HPCDL_ variables the session had: code a test runs in its
    own process (the agent, a Hydra app) may change them, and the tests after it start jobs from there."""
    folder, variables = os.getcwd(), {k: v for k, v in os.environ.items() if k.startswith("HPCDL_")}
    yield
    os.chdir(folder)
    for name in [k for k in os.environ if k.startswith("HPCDL_") and k not in variables]:
        del os.environ[name]
    os.environ.update(variables)


@pytest.fixture(scope="session")
def digits_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scikit-learn's digits written as PNG class folders, once per test session."""
    from hpcdl.data.digits import digits_folder

    return digits_folder(tmp_path_factory.mktemp("data") / "digits")


@pytest.fixture
def blobs() -> tuple[torch.Tensor, torch.Tensor]:
    """A separable 3-class problem: 4-feature points around three centres."""
    generator = torch.Generator().manual_seed(0)
    centres = torch.tensor([[2.0, 0, 0, 0], [0, 2.0, 0, 0], [0, 0, 2.0, 0]])
    labels = torch.arange(3).repeat(64)
    x = centres[labels] + 0.5 * torch.randn(len(labels), 4, generator=generator)
    return x, labels


def linear_model(seed: int = 0) -> torch.nn.Module:
    """A seeded linear classifier for the blobs problem."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty job store for this test, seen by this process and every process it starts."""
    root = tmp_path / "store"
    monkeypatch.setenv("HPCDL_STORE", str(root))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # ~/.hpcdl/stores of this test alone
    (tmp_path / "home").mkdir()
    return root


def keep_screenshot(image: Path, name: str) -> None:
    """Copy a screenshot a test took to $HPCDL_TEST_SCREENS/NAME, where a run asks for them (it stays in the
    test's own folder otherwise)."""
    folder = os.environ.get("HPCDL_TEST_SCREENS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(image, Path(folder) / name)


def job_folders(root: Path) -> list[str]:
    """The job folders in a store (none when the store was never created; hidden ones, like the index, left out)."""
    return sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) if root.is_dir() else []


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of this checkout (once a session), installed (not editable) in a folder."""
    work = tmp_path_factory.mktemp("wheel")
    shutil.copytree(REPO, work / "src", ignore=LEFT_OUT)  # the build writes build/ beside the sources
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(work / "dist"), str(work / "src")],
                   check=True, capture_output=True)
    (wheel,) = (work / "dist").glob("hpcdl-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(work / "site"), str(wheel)],
                   check=True, capture_output=True)
    return work / "site"
