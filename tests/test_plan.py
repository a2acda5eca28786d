"""One job plan, resolved once at the edge: strict composition, every rule before submission, a stored plan
that the ranks read without validating again, a dry run that needs no controller."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdl.config import Config
from hpcdl.config.compose import compose_config
from hpcdl.plan import JobPlan, resolve
from hpcdl.train.job import run_training
from tests.conftest import job_folders

BAD_OVERRIDES = [
    (["+training.max_epoch=3"], "training: unknown option 'max_epoch' (did you mean 'max_epochs'?)"),
    (["training.max_epoch=3"], "training: unknown option 'max_epoch' (did you mean 'max_epochs'?)"),
    (["+model._target_=mymodel.MyNet"], "model._target_: cannot import 'mymodel' for 'mymodel.MyNet': "
                                         "ModuleNotFoundError: No module named 'mymodel'"),
    (["model._target_=torch.nn.Linear", "+model.in_feature=4"],
     "model.in_feature: torch.nn.modules.linear.Linear takes no argument 'in_feature' (did you mean 'in_features'?)"),
    (["model._target_=torch.nn.Linear"], "model: torch.nn.modules.linear.Linear needs in_features, out_features"),
    (["model._target_=torch.nn.Lineer"], "model._target_: module 'torch.nn' has no 'Lineer' (did you mean "
                                         "'torch.nn.Linear'?)"),
    (["data._target_=torch.utils.data.TensorDataset", "data.augmentation.output_size=[8,8]"],
     "data.augmentation: torch.utils.data.dataset.TensorDataset takes no argument 'augmentation'"),
    (["model.widht=3"], "model: unknown option 'widht' (did you mean 'width'?)"),
    (["+data.augmentation.rotaton=[1,2]"], "data.augmentation: unknown option 'rotaton' (did you mean 'rotation'?)"),
    (["+cluster.network.extr.A=1"], "cluster.network: unknown option 'extr' (did you mean 'extra'?)"),
    (["+foo=1"], "config: unknown option 'foo'"),
    (["data.augmentation.rotation=[10,5]"], "data.augmentation.rotation: must be [low, high] with low <= high"),
    (["data.augmentation.output_size=[0]"], "data.augmentation.output_size: must be [height, width]"),
    (["data.augmentation.brightness=3.0"], "data.augmentation.brightness: must be in [0, 1)"),
    (["data.augmentation.scale=[0,2]"], "data.augmentation.scale: must be [low, high] of factors above 0"),
    (["+cluster.env.NCCL_NVLS_ENABLE=1"], "cluster.env: NCCL_NVLS_ENABLE must stay 0"),
    (["+cluster.network.extra.NCCL_NVLS_ENABLE=1"], "cluster.network.extra: NCCL_NVLS_ENABLE must stay 0"),
    (["cluster.time=2h"], "cluster.time: '2h' is not a Slurm time limit"),
    (["cluster=slurm", "training.execution_environment=gpu"], "training.execution_environment=gpu: no GPU per node"),
    (["cluster=slurm", "cluster.gpus_per_node=1", "training.gpus=[99]"], "training.gpus=[99]: only 1 GPU(s)"),
    (["data=folder", "data.root=/nonexistent/flowers"], "/nonexistent/flowers is not a folder"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD_OVERRIDES)
def test_bad_override_exits_2_naming_the_key_and_leaves_no_folder(store: Path, overrides: list[str],
                                                                  message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "hpcdl.submit", *overrides], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert job_folders(store) == []


def test_typo_in_a_user_profile_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "mine.yaml").write_text("name: mine\nbackend: local\npartitoin: gpu\n")
    monkeypatch.setenv("HPCDL_CONFIG_DIR", str(tmp_path))
    with pytest.raises(Exception, match="cluster: unknown option 'partitoin' \\(did you mean 'partition'\\?\\)"):
        compose_config(["cluster=mine"])


def _image_folders(root: Path, empty_class: bool) -> Path:
    from PIL import Image

    for label in ("cat", "dog"):
        (root / label).mkdir(parents=True)
        if not (empty_class and label == "dog"):
            Image.new("RGB", (8, 8)).save(root / label / "a.png")
    return root


def test_data_root_is_checked_at_submission(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(Exception, match="holds no class folders"):
        resolve(compose_config(["data=folder", f"data.root={empty}"]))
    with pytest.raises(Exception, match="class folder .*dog holds no images"):
        resolve(compose_config(["data=folder", f"data.root={_image_folders(tmp_path / 'a', True)}"]))
    resolve(compose_config(["data=folder", f"data.root={_image_folders(tmp_path / 'b', False)}"]))


def test_plan_holds_the_resolved_job_and_round_trips_through_the_manifest() -> None:
    config = compose_config(["cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=2",
                             "training.execution_environment=parallel", "training.worker_load=[1,0,2,1]",
                             "training.mini_batch_size=64", "training.lr_scaling=linear",
                             "training.lr_reference_batch=32", "training.initial_learn_rate=0.1",
                             "cluster.time=1-00:30:00", "+cluster.env.MY_FLAG=x y"])
    plan = resolve(config)
    assert (plan.world_size, plan.lead_rank, plan.global_batch) == (4, 0, 64)
    assert plan.worker_batches == (16, 0, 32, 16)
    assert plan.learn_rate == pytest.approx(0.2)
    assert plan.time_limit_s == 24 * 3600 + 1800 and plan.time_limit_minutes == 1470
    assert plan.environment["MY_FLAG"] == "x y" and plan.environment["NCCL_NVLS_ENABLE"] == "0"
    stored = json.loads(json.dumps(plan.to_dict()))
    assert JobPlan.from_dict(stored) == plan


def test_a_rank_reads_the_stored_plan_without_validating_it(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = resolve(compose_config(["training.max_epochs=2"]))
    stored = json.loads(json.dumps(plan.to_dict()))
    calls = []
    monkeypatch.setattr("hpcdl.config.fields.check_types", lambda section: calls.append(section))
    for section in (Config, *[type(getattr(plan.config, name)) for name in ("model", "data", "training")]):
        monkeypatch.setattr(section, "__post_init__", lambda self: calls.append(self))
    restored = JobPlan.from_dict(stored)
    assert calls == []
    assert restored.config.training.max_epochs == 2 and isinstance(restored.config, Config)


def _option_classes(section: object) -> set[type]:
    """The class of ``section`` and of every section nested in it."""
    found = {type(section)}
    for field in dataclasses.fields(section):
        value = getattr(section, field.name)
        if dataclasses.is_dataclass(value):
            found |= _option_classes(value)
    return found


def test_a_rank_trains_from_the_stored_plan_without_validating_any_option(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    plan = resolve(compose_config(["training.max_epochs=1", "training.verbose=false", "training.plots=none",
                                   "data.augmentation.output_size=[8,8]"]))
    restored = JobPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    calls = []
    for section in _option_classes(restored.config):
        monkeypatch.setattr(section, "__post_init__", lambda self: calls.append(type(self).__name__))
    summary = run_training(restored, tmp_path / "job")
    assert summary["iterations"] > 0 and (tmp_path / "job" / "model.pt").is_file()
    assert calls == []


def test_dry_run_with_the_controller_down_prints_the_script(store: Path, tmp_path: Path) -> None:
    # a slurm.conf whose controller port nobody listens on: sinfo cannot get an answer
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=nowhere\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=9\n"
                    "NodeName=n1 CPUs=1 State=UNKNOWN\nPartitionName=debug Nodes=n1 Default=YES\n")
    env = {**__import__("os").environ, "SLURM_CONF": str(conf)}
    done = subprocess.run([sys.executable, "-m", "hpcdl.submit", "cluster=slurm", "dry_run=true"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --job-name=train" in done.stdout and "-m submitit.core._submit" in done.stdout
    assert "# note: the controller did not answer" in done.stdout
    assert job_folders(store) == []
