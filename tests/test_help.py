"""The tree documents itself: --help, --cfg job and README's option tables all come from the field docstrings."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml

from hpcdl.config import AugmentationConfig, ClusterConfig, Config, DataConfig, ModelConfig, NetworkConfig
from hpcdl.config import TrainingOptions
from hpcdl.config.fields import type_name
from hpcdl.config.remote import RemoteConfig
from hpcdl.config.help import config_groups, field_docs, help_or_cfg, help_text, markdown_tables, sections, show

REPO = Path(__file__).resolve().parents[1]


def cli(tmp_path: Path, module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -X importtime -m module args`` in an empty folder, with an empty job store."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HPCDL_STORE": str(tmp_path / "store")}
    return subprocess.run([sys.executable, "-X", "importtime", "-m", module, *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True)


def test_sections_are_found_by_walking_the_tree_from_config() -> None:
    assert sections() == {"": Config, "model": ModelConfig, "data": DataConfig,
                          "data.augmentation": AugmentationConfig, "training": TrainingOptions,
                          "cluster": ClusterConfig, "cluster.network": NetworkConfig,
                          "cluster.remote": RemoteConfig}


@pytest.mark.parametrize("path", list(sections()))
def test_every_field_of_every_section_has_a_docstring(path: str) -> None:
    cls = sections()[path]
    missing = [f.name for f in dataclasses.fields(cls) if not field_docs(cls).get(f.name, "").strip()]
    assert not missing, f"{path or 'config'}: fields without a docstring under them: {missing}"


def test_help_lists_every_option_with_its_type_and_default() -> None:
    text = help_text("usage: test", Config())
    for path, cls in sections().items():
        section = Config()
        for name in filter(None, path.split(".")):
            section = getattr(section, name)
        for name, hint in typing.get_type_hints(cls).items():
            key = f"{path}.{name}".lstrip(".")
            if key not in sections():  # a subsection: its options are listed under it
                kind, value = re.escape(type_name(hint)), re.escape(show(getattr(section, name)))
                assert re.search(rf"^  {re.escape(key)} +{kind} +{value} +\S", text, re.MULTILINE), key


def test_help_shows_the_values_composed_with_the_overrides_given(capsys: pytest.CaptureFixture[str]) -> None:
    assert help_or_cfg(["cluster=slurm", "training.max_epochs=3", "--help"], "usage: test") == 0
    text = capsys.readouterr().out
    assert re.search(r"^  cluster\.backend +str +slurm ", text, re.MULTILINE)
    assert re.search(r"^  training\.max_epochs +int +3 ", text, re.MULTILINE)
    assert re.search(r"^  cluster +local\*, slurm", text, re.MULTILINE)


def test_config_groups_include_the_users_own_profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "mycluster.yaml").write_text("name: mycluster\n")
    monkeypatch.setenv("HPCDL_CONFIG_DIR", str(tmp_path))
    profiles = config_groups()["cluster"]  # the packaged ones (a profile per backend) and the user's
    assert profiles == sorted(profiles) and {"local", "mycluster", "slurm"} <= set(profiles)


def test_readme_tables_are_the_generated_ones() -> None:
    readme = (REPO / "README.md").read_text()
    for marker in ("config", "model", "data", "data.augmentation", "training", "cluster", "cluster.network", "cluster.remote"):
        assert f"<!-- options:{marker} -->" in readme and f"<!-- /options:{marker} -->" in readme, marker
    assert markdown_tables(readme) == readme, "run: python -m hpcdl.config.help --markdown --write README.md"


@pytest.mark.parametrize("module", ["hpcdl.run", "hpcdl.submit"])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_cli_help_lists_the_options_and_imports_no_torch(tmp_path: Path, module: str, flag: str) -> None:
    done = cli(tmp_path, module, flag)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"python -m {module} [overrides]")
    assert re.search(r"^  training\.max_epochs +int +8 +Passes over", done.stdout, re.MULTILINE)
    assert not re.search(r"\| +torch$", done.stderr, re.MULTILINE), "--help imported torch"


@pytest.mark.parametrize("module", ["hpcdl.run", "hpcdl.submit"])
def test_cfg_job_prints_the_composed_config_and_runs_nothing(tmp_path: Path, module: str) -> None:
    done = cli(tmp_path, module, "--cfg", "job", "training.max_epochs=3", "cluster=slurm")
    assert done.returncode == 0, done.stderr
    assert "  max_epochs: 3\n" in done.stdout and "  backend: slurm\n" in done.stdout
    assert not list(tmp_path.iterdir())  # no run folder, no job store


def test_cfg_job_shows_a_users_network_with_its_arguments_and_no_built_in_options(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert help_or_cfg(["--cfg", "job", "model._target_=torch.nn.Linear", "+model.in_features=4",
                        "+model.out_features=3", "data=folder", "data.root=/tmp"], "usage: test") == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["model"] == {"_target_": "torch.nn.Linear", "in_features": 4, "out_features": 3}
    assert shown["data"]["root"] == "/tmp" and "args" not in shown["data"]


@pytest.mark.parametrize(("args", "message"), [
    (["--cfg", "job", "training.max_epoch=3"], "unknown option 'max_epoch' (did you mean 'max_epochs'?)"),
    (["--cfg", "hydra"], "--cfg hydra: use --cfg job"),
    (["--help", "model.width=0"], "model.width: must be a positive integer"),
])
def test_cfg_and_help_name_a_bad_override(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    assert help_or_cfg(args, "usage: test") == 2
    assert message in capsys.readouterr().err


def test_every_options_whole_description_is_in_the_help_and_the_readme_tables() -> None:
    help_words = " ".join(help_text("usage: test", Config()).split())
    readme = (REPO / "README.md").read_text()
    for path, cls in sections().items():
        for name, doc in field_docs(cls).items():
            key, whole = f"{path}.{name}".lstrip("."), " ".join(doc.split())
            if key in sections():
                continue  # a subsection: its own heading
            assert whole in help_words, f"{key}: its description is cut in --help"
            assert re.sub(r"[|*]", r"\\\g<0>", whole) in readme, f"{key}: its description is cut in README"
