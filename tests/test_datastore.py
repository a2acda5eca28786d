"""Image datastores on real files (and a real S3 endpoint on loopback), augmentation, background dispatch."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hpcdl import ConfigError, ImageDatastore, TrainingOptions, build_model, train_network
from hpcdl.data.augment import AugmentedImageDatastore
from hpcdl.data.encoded import decoded_on_cpu
from hpcdl.data.images import BadImageError
from hpcdl.data.loader import BatchLoader, default_workers

FORMATS = {"a": [("0.png", "RGB"), ("1.jpg", "RGB"), ("2.bmp", "L")],
           "b": [("0.tif", "RGBA"), ("1.png", "L"), ("2.png", "RGBA")],
           "c": [("0.jpeg", "RGB"), ("1.tiff", "RGB"), ("2.png", "RGB")]}


def write_tree(root: Path, size: int = 16) -> Path:
    """Real image files: every format, grayscale, RGB and RGBA; label c is brighter than b than a."""
    rng = np.random.default_rng(0)
    for level, (label, files) in enumerate(FORMATS.items()):
        (root / label).mkdir(parents=True)
        for name, mode in files:
            pixels = (rng.integers(0, 60, (size, size, 4)) + 90 * level).astype(np.uint8)
            image = Image.fromarray(pixels, "RGBA").convert(mode)
            image.save(root / label / name)
    return root


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "images")


def test_every_format_and_mode_reads_as_the_network_expects(tree: Path) -> None:
    rgb = ImageDatastore(tree, channels=3)
    assert rgb.classes == ["a", "b", "c"] and len(rgb) == 9
    assert rgb.count_per_label() == {"a": 3, "b": 3, "c": 3}
    for i in range(len(rgb)):
        x, y = rgb[i]
        assert x.dtype == torch.uint8 and x.shape == (3, 16, 16) and y == rgb.labels[i]
    grey = ImageDatastore(tree, channels=1, image_size=[8, 12])
    assert all(grey[i][0].shape == (1, 8, 12) for i in range(len(grey)))


def test_labels_from_a_csv(tree: Path, tmp_path: Path) -> None:
    listing = tmp_path / "labels.csv"
    listing.write_text("path,label\na/0.png,cat\nb/1.png,dog\nc/2.png,cat\n")
    store = ImageDatastore(tree, labels_csv=listing, channels=3)
    assert store.classes == ["cat", "dog"] and store.labels.tolist() == [0, 1, 0]


def test_split_by_fraction_or_count_is_per_label_and_repeatable(tree: Path) -> None:
    store = ImageDatastore(tree)
    rest, held = store.split(1, seed=3)
    assert held.count_per_label() == {"a": 1, "b": 1, "c": 1} and len(rest) == 6
    assert store.split(1, seed=3)[1].paths == held.paths
    assert store.split(0.34, seed=1)[1].count_per_label() == {"a": 1, "b": 1, "c": 1}
    assert store.shuffle(5).paths == store.shuffle(5).paths != store.paths


def test_empty_folder_or_empty_class_is_an_error_at_construction(tmp_path: Path, tree: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no class folders"):
        ImageDatastore(tmp_path / "empty")
    (tree / "d").mkdir()
    (tree / "d" / "notes.txt").write_text("not an image")
    with pytest.raises(ConfigError, match="class folder .*/d holds no images"):
        ImageDatastore(tree)


def _corrupt(tree: Path) -> Path:
    bad = tree / "a" / "9.png"
    bad.write_bytes((tree / "a" / "0.png").read_bytes()[:60])  # truncated
    return bad


def test_unreadable_image_is_an_error_naming_the_file(tree: Path) -> None:
    bad = _corrupt(tree)
    store = ImageDatastore(tree, channels=3)
    with pytest.raises(BadImageError, match=f"cannot read image {bad}"):
        store[store.paths.index(str(bad))]


@pytest.mark.parametrize("background", [False, True])
def test_skipped_bad_files_are_warned_and_counted(tree: Path, background: bool) -> None:
    _corrupt(tree)
    store = ImageDatastore(tree, channels=3, on_bad_file="skip")
    options = TrainingOptions(max_epochs=2, mini_batch_size=4, verbose=False, execution_environment="cpu",
                              dispatch_in_background=background, num_workers=1)
    model = build_model("small_cnn", in_channels=3, num_classes=3, width=4)
    with pytest.warns(UserWarning, match="skipping unreadable image") if not background else _nothing():
        _, info = train_network(store, model, options)
    assert info.skipped_files == 2  # one bad file, two epochs


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *args: object) -> None:
        return None


def test_augmentation_is_deterministic_per_sample_and_epoch(tree: Path) -> None:
    store = ImageDatastore(tree, channels=3)
    augmented = AugmentedImageDatastore(store, [12, 12], crop="random", random_x_reflection=True,
                                        rotation=[-20, 20], scale=[0.9, 1.1], x_translation=[-2, 2], shear=[-5, 5],
                                        brightness=0.2, contrast=0.2, saturation=0.2, seed=7)
    first = augmented[(4, 0)][0]
    assert first.shape == (3, 12, 12) and first.dtype == torch.uint8
    assert torch.equal(first, augmented[(4, 0)][0])
    assert not torch.equal(first, augmented[(4, 1)][0])
    assert not torch.equal(first, AugmentedImageDatastore(store, [12, 12], crop="random", seed=8)[(4, 0)][0])


def test_reflection_alone_mirrors_exactly(tree: Path) -> None:
    store = ImageDatastore(tree, channels=3)
    flipping = AugmentedImageDatastore(store, [16, 16], random_x_reflection=True, seed=0)
    original = store[0][0]
    seen = {tuple(flipping[(0, epoch)][0].flatten().tolist()) for epoch in range(12)}
    assert seen == {tuple(original.flatten().tolist()), tuple(original.flip(-1).flatten().tolist())}


def test_center_crop_and_resize(tree: Path) -> None:
    store = ImageDatastore(tree, channels=3)
    center = AugmentedImageDatastore(store, [8, 8], crop="center")[0][0]
    assert torch.equal(center, store[0][0][:, 4:12, 4:12])
    assert AugmentedImageDatastore(store, [32, 24])[0][0].shape == (3, 32, 24)


def test_background_dispatch_trains_exactly_as_the_main_process(tree: Path) -> None:
    store = AugmentedImageDatastore(ImageDatastore(tree, channels=3), [12, 12], crop="random",
                                    random_x_reflection=True, rotation=[-10, 10])
    weights = []
    for background in (False, True):
        torch.manual_seed(0)
        model = build_model("small_cnn", in_channels=3, num_classes=3, width=4)
        options = TrainingOptions(max_epochs=3, mini_batch_size=4, verbose=False, execution_environment="cpu",
                                  dispatch_in_background=background, num_workers=2, shuffle="every-epoch")
        model, _ = train_network(store, model, options)
        weights.append(model.state_dict())
    for name, tensor in weights[0].items():
        torch.testing.assert_close(weights[1][name], tensor, rtol=0, atol=0)


def test_workers_default_to_the_cpus_slurm_gives_the_task(monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcdl.cluster import backend_for
    from hpcdl.host import TASK_CPUS

    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "6")
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "8")
    assert backend_for("slurm").task_cpus() == 6 and backend_for("local").task_cpus() is None
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    monkeypatch.setenv("SLURM_LOCALID", "0")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "1")
    assert backend_for("slurm").task_cpus() == 8  # no --cpus-per-task: the node's allocation, one task there
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "4")
    assert backend_for("slurm").task_cpus() == 2  # four tasks share it
    monkeypatch.setenv(TASK_CPUS, "6")  # as the worker sets it in the ranks from its backend
    assert default_workers() == 5
    monkeypatch.delenv(TASK_CPUS)
    assert default_workers() == max(1, len(os.sched_getaffinity(0)) - 1)


def test_a_rank_reads_only_its_share(tree: Path) -> None:
    class Counting(torch.utils.data.Dataset):
        def __init__(self, store: ImageDatastore) -> None:
            self.store, self.read = store, []

        def __len__(self) -> int:
            return len(self.store)

        def __getitem__(self, index: int):  # noqa: ANN204 - Dataset protocol
            self.read.append(index)
            return self.store[index]

    data = Counting(ImageDatastore(tree, channels=3))
    share = [torch.tensor([1, 5]), torch.tensor([7])]
    list(BatchLoader(data, torch.device("cpu"), torch.contiguous_format).epoch(share, 0))
    assert sorted(data.read) == [1, 5, 7]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def s3_endpoint(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201 - yields the endpoint URL
    """A real S3 endpoint (moto's server) on loopback, for this test alone."""
    pytest.importorskip("s3fs")
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for name, value in {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "moto server did not start"
            time.sleep(0.2)
    yield url
    server.terminate()
    server.wait(10)


def test_s3_root_reads_the_same_images_and_trains_unchanged(tree: Path, s3_endpoint: str) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket="datasets")
    for path in sorted(tree.rglob("*.*")):
        client.upload_file(str(path), "datasets", f"images/{path.relative_to(tree)}")
    local, remote = ImageDatastore(tree, channels=3), ImageDatastore("s3://datasets/images", channels=3)
    assert remote.classes == local.classes and remote.labels.tolist() == local.labels.tolist()
    for i in range(len(local)):
        assert torch.equal(remote[i][0], local[i][0])
    model = build_model("small_cnn", in_channels=3, num_classes=3, width=4)
    options = TrainingOptions(max_epochs=2, mini_batch_size=3, verbose=False, execution_environment="cpu",
                              dispatch_in_background=True, num_workers=1)
    _, info = train_network(remote, model, options)
    assert len(info.history) == 6


def test_augmented_datastore_follows_the_config_rules_from_python(tree: Path) -> None:
    store = ImageDatastore(tree, channels=3)
    with pytest.raises(ConfigError, match=r"data.augmentation.rotation: must be \[low, high\] with low <= high"):
        AugmentedImageDatastore(store, [12, 12], rotation=(10, 5))
    with pytest.raises(ConfigError, match=r"data.augmentation.brightness: must be in \[0, 1\)"):
        AugmentedImageDatastore(store, [12, 12], brightness=2)


def test_resized_jpeg_is_decoded_at_a_reduced_scale_no_smaller_than_the_output(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (400, 300, 3), dtype=np.uint8)).save(tmp_path / "a" / "0.jpg")
    store = ImageDatastore(tmp_path, channels=3)
    assert store.read(0).shape == (400, 300, 3)
    assert store.read(0, draft=(90, 60)).shape == (100, 75, 3)  # DCT scaling by 4: not below the output
    resized = AugmentedImageDatastore(store, [90, 60])
    assert resized.draft == (90, 60) and AugmentedImageDatastore(store, [90, 60], crop="random").draft is None
    assert resized[0][0].shape == (3, 90, 60)


def _pil_as_nvjpeg(files, channels, device):  # noqa: ANN001, ANN202 - stands in for hpcdl.data.encoded.nvjpeg
    import io

    from hpcdl.data.images import MODES, as_chw

    return [as_chw(np.array(Image.open(io.BytesIO(f.numpy().tobytes())).convert(MODES[channels]))).to(device)
            for f in files]


@pytest.mark.parametrize(("background", "cpu_share"), [(False, 0.0), (True, 0.0), (True, 0.7), (False, 1.0)])
def test_encoded_path_gives_the_batches_of_the_decoding_workers(tree: Path, background: bool, cpu_share: float,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers shipping bytes (PNG, BMP, TIFF and a share of the JPEG files decoded by them) and one batched
    decode: the same batches, in the same order."""
    on_gpu: list[int] = []

    def counting(files, channels, device):  # noqa: ANN001, ANN202
        on_gpu.append(len(files))
        return _pil_as_nvjpeg(files, channels, device)

    monkeypatch.setattr("hpcdl.data.encoded.nvjpeg", counting)
    store = AugmentedImageDatastore(ImageDatastore(tree, channels=3), [12, 12], crop="random",
                                    random_x_reflection=True, rotation=[-10, 10], brightness=0.2, seed=3)
    chunks = [torch.tensor([0, 4, 8, 1]), torch.tensor([2, 3, 5, 6, 7])]
    batches = []
    for encoded in (False, True):
        loader = BatchLoader(store, torch.device("cpu"), torch.channels_last, background, workers=1,
                             gpu_decode=encoded, cpu_decode_share=cpu_share)
        batches.append(list(loader.epoch(chunks, 2)))
    for (x, y), (x2, y2) in zip(*batches):
        assert x2.dtype == torch.float32 and x2.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(x2, x, rtol=0, atol=0)
        assert torch.equal(y2, y)
    jpegs = [i for i, path in enumerate(store.store.paths) if path.endswith((".jpg", ".jpeg"))]
    gpu = [i for i in jpegs if not decoded_on_cpu(i, 2, cpu_share)]
    assert sum(on_gpu) == len(gpu) == {0.0: len(jpegs), 1.0: 0, 0.7: 1}[cpu_share]


def test_the_workers_share_of_jpeg_decoding_is_spread_evenly() -> None:
    for share in (0.0, 0.3, 0.7, 1.0):
        for epoch in (0, 5):
            picked = [decoded_on_cpu(i, epoch, share) for i in range(2560)]
            assert abs(sum(picked) - share * 2560) <= 2  # the whole epoch
            for start in range(0, 2560, 256):  # and each batch of 256 consecutive indices
                assert abs(sum(picked[start:start + 256]) - share * 256) <= 3
    assert [decoded_on_cpu(i, 0, 0.5) for i in range(64)] != [decoded_on_cpu(i, 1, 0.5) for i in range(64)]


def test_encoded_path_names_a_corrupt_jpeg_and_falls_back_per_file(tree: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    refused = str(tree / "c" / "0.jpeg")

    def picky(files, channels, device):  # noqa: ANN001, ANN202 - nvJPEG refusing one file fails the batch
        if any(f.numpy().tobytes() == Path(refused).read_bytes() for f in files):
            raise RuntimeError("Error while decoding JPEG images")
        return _pil_as_nvjpeg(files, channels, device)

    monkeypatch.setattr("hpcdl.data.encoded.nvjpeg", picky)
    store = AugmentedImageDatastore(ImageDatastore(tree, channels=3), [12, 12], crop="center")
    loader = BatchLoader(store, torch.device("cpu"), torch.contiguous_format, gpu_decode=True)
    everything = torch.arange(len(store))
    (x, _), = loader.epoch([everything], 0)  # the refused file is decoded on the CPU
    (expected, _), = BatchLoader(store, torch.device("cpu"), torch.contiguous_format).epoch([everything], 0)
    torch.testing.assert_close(x, expected, rtol=0, atol=0)
    bad = tree / "a" / "1.jpg"
    bad.write_bytes(bad.read_bytes()[:200])  # cut short
    with pytest.raises(BadImageError, match=f"cannot read image {bad}"):
        list(loader.epoch([everything], 0))


def test_data_wait_counts_the_time_spent_getting_batches(blobs) -> None:
    class Slow(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 32

        def __getitem__(self, index: int):  # noqa: ANN204 - Dataset protocol
            time.sleep(0.005)
            return blobs[0][index], blobs[1][index]

    model = torch.nn.Linear(blobs[0].shape[1], int(blobs[1].max()) + 1)
    options = TrainingOptions(max_epochs=2, mini_batch_size=8, verbose=False, execution_environment="cpu")
    _, info = train_network(Slow(), model, options)
    assert info.data_wait_s >= 64 * 0.005
    assert sum(r["data_wait_s"] for r in info.history) == pytest.approx(info.data_wait_s, abs=1e-4)
    assert info.data_wait_share > 0.5
