"""The built-in trainer with the user's own network and dataset (model._target_, data._target_) on the local
profile: submitted from the user's folder, trained by a detached job, fetched and loaded back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import job_folders
from tests.user_parts import write_user_code


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def _submit_and_fetch(cwd: Path, to: Path, *overrides: str) -> dict:
    submitted = _cli(cwd, "hpcdl.submit", "training.max_epochs=2", "training.verbose=false", *overrides)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split()[2]
    waited = _cli(cwd, "hpcdl.jobs", "wait", job_id, "--timeout", "240")
    assert waited.stdout.strip() == "COMPLETED", _cli(cwd, "hpcdl.jobs", "show", job_id).stdout
    assert _cli(cwd, "hpcdl.jobs", "fetch", job_id, "--to", str(to)).returncode == 0
    return json.loads((to / "result.json").read_text())


def test_own_network_trains_on_the_built_in_digits_and_loads_back(store: Path, digits_root: Path,
                                                                  tmp_path: Path) -> None:
    user = write_user_code(tmp_path / "user")
    summary = _submit_and_fetch(user, tmp_path / "got", f"data.root={digits_root}",
                                "model._target_=mynets.MyNet", "+model.hidden=12", "training.initial_learn_rate=0.05")
    assert summary["config"]["model"]["_target_"] == "mynets.MyNet"
    assert summary["config"]["model"]["args"] == {"hidden": 12}
    assert summary["network"] == {"in_channels": 1, "image_size": [8, 8], "num_classes": 10}
    info = json.loads((tmp_path / "got" / "info.json").read_text())
    assert info["history"][-1]["loss"] < info["history"][0]["loss"]  # it trained (no accuracy luck asked)
    sys.path.insert(0, str(user))
    try:
        import mynets

        net = mynets.MyNet(1, 10, [8, 8], hidden=12)
    finally:
        sys.path.remove(str(user))
    net.load_state_dict(torch.load(tmp_path / "got" / "model.pt", weights_only=True))
    assert net.hidden == 12


def test_own_transform_runs_on_every_training_image_of_each_epoch(store: Path, digits_root: Path,
                                                                  tmp_path: Path) -> None:
    from hpcdl import ImageDatastore

    user = write_user_code(tmp_path / "user")
    log = tmp_path / "calls.log"
    _submit_and_fetch(user, tmp_path / "got", f"data.root={digits_root}", "data.transform=mynets.logged",
                      f"+data.transform_args.log={log}", "training.dispatch_in_background=true",
                      "training.num_workers=2")
    trained = len(ImageDatastore(digits_root).split(0.2, seed=0)[0])
    # 2 epochs, and once before them for the shape the network is built for; validation images untouched
    assert len(log.read_text().splitlines()) == 2 * trained + 1


def test_own_transform_gives_the_training_images_and_leaves_validation_alone(digits_root: Path) -> None:
    from hpcdl.config.compose import compose_config
    from hpcdl.train.job import training_data

    plain = training_data(compose_config([f"data.root={digits_root}"]))
    inverted = training_data(compose_config([f"data.root={digits_root}", "data.transform=torch.bitwise_not"]))
    for i in (0, 7):
        assert torch.equal(inverted[0][i][0], ~plain[0][i][0]) and inverted[0][i][1] == plain[0][i][1]
        assert torch.equal(inverted[1][i][0], plain[1][i][0])


@pytest.mark.parametrize(("overrides", "message"), [
    (["data.transform=torch.bitwise_nott"], "module 'torch' has no 'bitwise_nott' (did you mean 'torch.bitwise_not'?)"),
    (["data.transform=torch.nn.Dropout", "+data.transform_args.pp=0.5"],
     "data.transform_args.pp: torch.nn.modules.dropout.Dropout takes no argument 'pp' (did you mean 'p'?)"),
    (["+data.transform_args.p=0.5"], "data.transform_args: arguments of data.transform, which is not set"),
    (["data.transform=torch.bitwise_not", "training.gpu_decode=on"], "where data.transform (run in the workers)"),
    (["data._target_=mynets.make_blobs", "+data.n=10", "data.transform=torch.bitwise_not"],
     "data.transform: mynets.make_blobs takes no argument 'transform'"),  # yours: its own keys
])
def test_a_bad_transform_is_refused_before_submission(store: Path, tmp_path: Path, overrides: list[str],
                                                      message: str) -> None:
    user = write_user_code(tmp_path / "user")
    refused = _cli(user, "hpcdl.submit", *overrides)
    assert refused.returncode == 2 and message in refused.stderr, refused.stderr
    assert job_folders(store) == []


def test_own_dataset_and_network_train_with_a_held_out_share(store: Path, tmp_path: Path) -> None:
    user = write_user_code(tmp_path / "user")
    summary = _submit_and_fetch(user, tmp_path / "got", "data._target_=mynets.make_blobs", "+data.n=120",
                                "data.validation_fraction=0.25", "model._target_=mynets.MyNet",
                                "training.mini_batch_size=16")
    assert summary["config"]["data"]["args"] == {"n": 120}
    assert summary["classes"] == ["a", "b", "c"]
    info = json.loads((tmp_path / "got" / "info.json").read_text())
    per_epoch = -(-90 // 16)  # 120 less the 30 held out, in batches of 16
    assert info["history"][-1]["iteration"] == 2 * per_epoch
    assert len(info["validation_history"]) >= 1 and summary["validation_accuracy"] is not None


def test_a_network_of_lazy_layers_trains_and_loads_back(store: Path, tmp_path: Path) -> None:
    user = write_user_code(tmp_path / "user")
    summary = _submit_and_fetch(user, tmp_path / "got", "data._target_=mynets.make_blobs", "+data.n=60",
                                "model._target_=mynets.LazyNet", "training.channels_last=true",
                                "training.mini_batch_size=16")
    assert summary["classes"] == ["a", "b", "c"]
    state = torch.load(tmp_path / "got" / "model.pt", weights_only=True)
    assert state["body.0.weight"].shape == (4, 1, 3, 3) and state["body.4.weight"].shape == (3, 4 * 4 * 4)
    info = json.loads((tmp_path / "got" / "info.json").read_text())
    assert info["history"][-1]["loss"] < info["history"][0]["loss"]


def test_a_target_that_does_not_import_is_refused_before_submission(store: Path, tmp_path: Path) -> None:
    user = write_user_code(tmp_path / "user")
    (user / "broken.py").write_text("import not_installed_anywhere\n")
    done = _cli(user, "hpcdl.submit", "model._target_=broken.Net")
    assert done.returncode == 2
    assert ("model._target_: cannot import 'broken' for 'broken.Net': ModuleNotFoundError: "
            "No module named 'not_installed_anywhere'") in done.stderr
    done = _cli(user, "hpcdl.submit", "data._target_=mynets.make_blobs", "+data.count=5")
    assert done.returncode == 2
    assert "data.count: mynets.make_blobs takes no argument 'count'" in done.stderr
    assert "data: mynets.make_blobs needs n" not in done.stderr
    assert job_folders(store) == []


def test_a_target_that_exits_at_import_is_refused_with_exit_2(store: Path, tmp_path: Path) -> None:
    user = write_user_code(tmp_path / "user")
    (user / "quits.py").write_text("import sys\nsys.exit(0)\n")
    done = _cli(user, "hpcdl.submit", "model._target_=quits.Net")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "model._target_: importing 'quits' for 'quits.Net' called sys.exit(0)" in done.stderr
    assert job_folders(store) == []


def test_a_target_whose_import_hangs_is_refused_after_the_timeout(store: Path, tmp_path: Path) -> None:
    user = write_user_code(tmp_path / "user")
    (user / "hangs.py").write_text("import time\ntime.sleep(3600)\n")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "hpcdl.submit", "data._target_=hangs.make"], capture_output=True,
                          text=True, timeout=120, cwd=user, env={**os.environ, "HPCDL_IMPORT_TIMEOUT_S": "3"})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "data._target_: importing 'hangs' for 'hangs.make' did not finish within 3 s" in done.stderr
    assert time.monotonic() - started < 60
    assert job_folders(store) == []


@pytest.mark.parametrize("overrides, message", [
    (["+model.hidden=-1", "+data.n=30"], "model: building mynets.MyNet failed: RuntimeError: "),
    (["+model.hidden=4", "+data.n=-5"], "data: building mynets.make_blobs failed: RuntimeError: "),
])
def test_check_build_refuses_a_constructor_that_rejects_its_arguments(store: Path, tmp_path: Path,
                                                                      overrides: list[str], message: str) -> None:
    user = write_user_code(tmp_path / "user")
    parts = ["model._target_=mynets.MyNet", "data._target_=mynets.make_blobs", *overrides]
    assert _cli(user, "hpcdl.submit", *parts, "dry_run=true").returncode == 0  # not built unless asked
    done = _cli(user, "hpcdl.submit", *parts, "check_build=true")
    assert done.returncode == 2
    assert message in done.stderr, done.stderr
    assert job_folders(store) == []


def test_a_group_file_of_the_users_own_names_a_target(tmp_path: Path, monkeypatch) -> None:
    from hpcdl.config.compose import compose_config

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "lin.yaml").write_text("_target_: torch.nn.Linear\nin_features: 4\nout_features: 2\n")
    (tmp_path / "model" / "typo.yaml").write_text("name: mlp\nwidht: 3\n")
    monkeypatch.setenv("HPCDL_CONFIG_DIR", str(tmp_path))
    model = compose_config(["model=lin", "model.out_features=5"]).model
    assert model._target_ == "torch.nn.Linear" and model.args == {"in_features": 4, "out_features": 5}
    import pytest

    with pytest.raises(Exception, match=r"model: unknown option 'widht' \(did you mean 'width'\?\)"):
        compose_config(["model=typo"])
