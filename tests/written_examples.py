"""The examples a user reads, found and run as written: the README's fenced blocks and command lines, and the
example commands of every --help. Shared by tests/test_as_written.py (this machine) and
tests/test_slurm_as_written.py (the test cluster).

What is changed before a command runs is all here, in plain tables: PLACEHOLDERS (a path or a job id the text
stands for), APPENDED (an override that shrinks the work: one epoch), USER_FILES (the user's own files an example
names, written into the folder it runs in), PRELUDES (names a fragment of a user's script assumes). SKIPPED lists
what cannot run here, keyed by a substring of the examples it covers, with the reason.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from tests.reference_script import LIGHTNING_SCRIPT, SCRIPT as REFERENCE_SCRIPT
from tests.user_code import ENTRY

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`((?:python|bash|cd|eval|pip|hpcdl-)[ -][^`]*)`")
COMMAND = re.compile(r"^\s*(?:python|bash|cd|eval|pip|hpcdl-\w+)\b")

HELP_COMMANDS = [
    "python -m hpcdl.submit --help", "python -m hpcdl.run --help", "python -m hpcdl.jobs --help",
    *(f"python -m hpcdl.jobs {verb} --help"
      for verb in ("list", "clean", "show", "logs", "watch", "wait", "cancel", "fetch", "resume", "why", "stacks",
                  "report", "tensorboard")),
    "python -m hpcdl.devices --help", "python -m hpcdl.profiles --help", "python -m hpcdl.doctor --help",
    *(f"python -m hpcdl.pool {verb}--help" for verb in ("", "start ", "list ", "stop ")),
    "python -m hpcdl.config.help --help",
    "python -m hpcdl.config.help",
    "hpcdl-submit --help", "hpcdl-jobs --help", "hpcdl-run --help", "hpcdl-devices --help",
]
"""Every --help a user can ask for; each must answer (exit 0), and the example commands it shows run."""

DOCSTRINGS = ["hydra_plugins/hpcdl_launcher/hpcdl_launcher.py"]
"""Modules whose docstring shows commands that no --help prints (Hydra's launcher plugin)."""

SKIPPED = {
    "pip install torch==": "installs into the running environment; tests/test_packaging.py installs the wheel",
    "pip install -e .": "installs into the running environment; tests/test_packaging.py installs the wheel",
    "tests/run-all.sh": "the whole test suite, this test included",
    "jobs stacks ID": "needs a running job's ranks; tests/test_doctor.py asks a running job for its stacks",
    "slurm/cluster.sh": "starts or stops the shared test cluster",
    "benchmarks": "a benchmark: minutes of measuring, some on a GPU or the test cluster",
    "python train.py ARGS": "not a command: what script= runs on each rank",
    "gpus_per_node=1": "needs a GPU node; the test cluster has none",
    "gpus_per_node: 1": "needs a GPU node; the test cluster has none",
    "gpus_per_node=4": "needs GPU nodes; the test cluster has none",
    "training.gpus=[0,2]": "needs two GPUs on this machine",
    "profiles check slurm": "asks the test cluster's controller; tests/test_slurm_remote.py runs these checks",
    "login.example.org": "a login node reachable over SSH; tests/test_remote.py runs such a profile through a test sshd",
    "cluster=mysite": "a login node reachable over SSH; tests/test_remote.py runs these commands through a test sshd",
    "logs JOB_ID -f": "a job on a login node over SSH; tests/test_remote.py follows one through a test sshd",
    "fetch JOB_ID": "a job on a login node over SSH; tests/test_remote.py fetches one through a test sshd",
}
"""Examples that do not run here, keyed by a substring of theirs, with the reason."""

PLACEHOLDERS: dict[str, Callable[["Workspace", str], str]] = {
    "/scratch/me/flowers": lambda w, _: str(w.digits),
    "s3://bucket/flowers": lambda w, _: f"file://{w.digits}",  # an fsspec URL all the same, with no network
    "[overrides]": lambda w, _: "",
    "SWEEP_ID": lambda w, _: w.ids["sweep"],
    "ID": lambda w, command: w.ids["cancelled" if " resume " in command else "completed"],
}
"""A text an example stands for something with -> what replaces it (in this order; ID only as a whole word)."""

APPENDED = {"hpcdl.submit": "training.max_epochs=1", "hpcdl.run": "training.max_epochs=1",
            "max_epochs=8, mini_batch_size": "max_epochs=1, mini_batch_size"}
"""Less work: an override added to each command of these (before a script's ``--``; the last value counts), or in
a Python snippet this text replaced."""

EXPECTED_EXIT = {"+model.depth=-1 check_build=true": (2, "depth must be >= 1")}
"""Examples the README says are refused: their exit status and what the error names."""

MYNETS = '''
import torch
from torch import nn


class MyNet(nn.Module):
    def __init__(self, num_classes, depth=18):
        super().__init__()
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.layers = nn.Sequential(nn.Flatten(), nn.LazyLinear(depth), nn.ReLU(), nn.Linear(depth, num_classes))

    def forward(self, x):
        return self.layers(x.float())


def make_dataset(n=1000):
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(n) % 10
    data = torch.utils.data.TensorDataset(torch.randn(n, 1, 8, 8, generator=generator) + labels[:, None, None, None],
                                          labels)
    data.classes = [str(k) for k in range(10)]
    return data
'''

MYTRANSFORMS = '''
class Posterize:
    def __init__(self, bits):
        self.mask = (0xFF << (8 - bits)) & 0xFF

    def __call__(self, image):
        return image & self.mask
'''

MY_APP = '''
import hydra


@hydra.main(version_base=None, config_path=".", config_name="config")
def main(config):
    return config.lr * config.seed


if __name__ == "__main__":
    main()
'''

USER_FILES = {
    "mynets.py": MYNETS, "mytransforms.py": MYTRANSFORMS, "train.py": REFERENCE_SCRIPT, "fit.py": LIGHTNING_SCRIPT,
    "mypkg/__init__.py": "def fit(lr):\n    return 2 * lr\n", "mypkg/train.py": ENTRY,
    "my_app.py": MY_APP, "config.yaml": "lr: 0.1\nseed: 0\n",
    "labels.csv": "",  # written from the digits by Workspace
    "README.md": README.read_text(),  # python -m hpcdl.config.help --markdown --write README.md rewrites it
}
"""The user's files the examples name (mynets.py, train.py, mypkg, my_app.py, ...), in the folder they run in."""

PRELUDES = {"hpcdl.load_checkpoint()": "import hpcdl, torch\nsteps = 3\nmodel = torch.nn.Linear(2, 2)\n"}
"""A fragment of a user's script (run as script= on a job), keyed by a substring: the names it assumes."""


@dataclass
class Example:
    """One example: where it is written, its language (bash, python, yaml), its text as written."""

    where: str
    language: str
    text: str

    def __str__(self) -> str:
        return f"{self.where}: {self.text.strip().splitlines()[0][:90]}"


def fenced_blocks(text: str, where: str) -> list[Example]:
    """Each fenced code block of Markdown ``text``; a shell block gives each of its command lines."""
    found = []
    for match in FENCE.finditer(text):
        line = text[:match.start()].count("\n") + 1
        if match[2] in ("bash", "sh", "console", "shell"):
            found += command_lines(match[3], f"{where}:{line}")
        else:
            found.append(Example(f"{where}:{line}", match[2], match[3]))
    return found


def command_lines(text: str, where: str, indented_only: bool = False) -> list[Example]:
    """The commands of shell text (of a help text: its indented lines): comments and blank lines left out,
    backslash continuations joined."""
    commands, pending = [], ""
    for line in text.splitlines():
        if indented_only and not pending and not line[:1].isspace():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        command = strip_comment(pending).strip()
        if command and COMMAND.match(command):
            commands += [Example(where, "bash", part) for part in chain_parts(" ".join(command.split()))]
        pending = ""
    return commands


def chain_parts(command: str) -> list[str]:
    """A ``a && b`` chain as its commands (each skipped or run on its own); a ``cd`` stays with what follows."""
    parts: list[str] = []
    for part in command.split(" && "):
        if parts and parts[-1].startswith("cd "):
            parts[-1] += " && " + part
        else:
            parts.append(part)
    return parts


def strip_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` (a ``#`` inside quotes or a word stays), as bash reads it."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def readme_examples() -> list[Example]:
    """The README's fenced blocks, then its inline commands (`python -m hpcdl.run --help` in the prose)."""
    text = README.read_text()
    found = fenced_blocks(text, "README.md")
    prose = FENCE.sub("", text)
    for match in INLINE.finditer(prose):
        command = " ".join(match[1].split())
        if not any(command == e.text for e in found):
            found.append(Example("README.md (prose)", "bash", command))
    return found


def help_examples(help_texts: dict[str, str]) -> list[Example]:
    """The example commands shown by each --help (``{command: its output}``) and the listed docstrings."""
    found = []
    for command, text in help_texts.items():
        found += command_lines(text, command, indented_only=True)
    for module in DOCSTRINGS:
        source = (REPO / module).read_text()
        found += command_lines(source[:source.index('"""', 3)], module, indented_only=True)
    return found


def skip_reason(example: Example) -> Optional[str]:
    return next((reason for key, reason in SKIPPED.items() if key in example.text), None)


def needs_slurm(example: Example) -> bool:
    return "cluster=slurm" in example.text or 'cluster="slurm"' in example.text


def runs_here(example: Example) -> bool:
    """Neither skipped nor for the test cluster (tests/test_slurm_as_written.py runs those)."""
    return not skip_reason(example) and not needs_slurm(example)


class Workspace:
    """A folder as a user's: their files, an empty store (HPCDL_STORE) and home, the digits as PNG folders."""

    def __init__(self, root: Path, digits: Path, installed: Optional[Path] = None) -> None:
        self.folder, self.digits = root / "user", digits
        self.ids: dict[str, str] = {}
        """The jobs the placeholders stand for: completed (ID), cancelled (ID of resume), sweep (SWEEP_ID)."""
        self.cancelled: set[str] = set()
        """Jobs an example cancelled: CANCELLED is their right end."""
        self.ran: set[str] = set()
        """Examples run already (the same command is shown by several helps)."""
        for name, text in USER_FILES.items():
            (self.folder / name).parent.mkdir(parents=True, exist_ok=True)
            (self.folder / name).write_text(text)
        (self.folder / "labels.csv").write_text("".join(
            f"{path.relative_to(digits)},{path.parent.name}\n" for path in sorted(digits.glob("*/*.png"))))
        (root / "home").mkdir()
        self.store = root / "store"
        scripts = [str(installed / "bin")] if installed else []  # the wheel's console scripts first
        self.env = {**os.environ, "HPCDL_STORE": str(self.store), "HOME": str(root / "home"),
                    "XDG_CACHE_HOME": str(digits.parent / "cache"),
                    "PATH": ":".join([*scripts, str(Path(sys.executable).parent), os.environ["PATH"]])}
        self.env.pop("HYDRA_FULL_ERROR", None)
        if installed:
            self.env["PYTHONPATH"] = str(installed)

    def substituted(self, example: Example) -> str:
        """The example's text with PLACEHOLDERS replaced and APPENDED added, as it is run."""
        text = example.text
        for placeholder, value in PLACEHOLDERS.items():
            if placeholder in text:
                text = re.sub(rf"(?<![\w/]){re.escape(placeholder)}(?![\w/])" if placeholder.isalnum()
                              else re.escape(placeholder), lambda _: value(self, text), text)
        for key, appended in APPENDED.items():
            if example.language == "bash" and re.search(rf"(-m |^){re.escape(key)}\b", text):
                words = text.split(" -- ", 1)
                text = " -- ".join([f"{words[0].rstrip()} {appended}", *words[1:]])
            elif example.language == "python":
                text = text.replace(key, appended)
        return text

    def run(self, example: Example, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """The example as a user runs it: a shell line through bash, Python as a file, a profile as a file."""
        text = self.substituted(example)
        if example.language == "bash":
            return self.shell(text, timeout)
        if example.language == "python":
            prelude = next((p for key, p in PRELUDES.items() if key in text), None)
            if prelude is not None:  # a part of the user's script: it runs as one, in a job
                (self.folder / "resumable.py").write_text(prelude + text)
                return self.shell("python -m hpcdl.submit script=resumable.py wait=true", timeout)
            (self.folder / "snippet.py").write_text(text)
            return self.shell("python snippet.py", timeout)
        if example.language == "yaml":  # a profile, written where its comment says, or as cluster=example
            match = re.match(r"# (~/\S+/cluster/(\w+)\.yaml)", text)
            path, name = (match[1].replace("~", self.env["HOME"], 1), match[2]) if match else (
                f"{self.env['HOME']}/.config/hpcdl/cluster/example.yaml", "example")
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
            return self.shell(f"python -m hpcdl.submit --cfg job cluster={name}", timeout)
        raise AssertionError(f"{example}: no way to run a {example.language!r} block; add one or skip it")

    def shell(self, command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["bash", "-c", command], cwd=self.folder, env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        submitted = re.search(r"^Submitted (job|sweep) ([\w.-]+)", done.stdout, re.MULTILINE)
        if submitted and submitted[1] == "sweep":
            self.ids["sweep"] = submitted[2]
        if re.search(r"jobs cancel (\S+)", command) and done.returncode == 0:
            self.cancelled.add(command.split("jobs cancel ")[1].split()[0])
        return done

    def run_all(self, examples: list[Example]) -> list[str]:
        """Run each example in turn, once however often it is written; what went wrong with each."""
        failures = []
        for example in examples:
            if example.text in self.ran:
                continue
            self.ran.add(example.text)
            done = self.run(example)
            status, names = expected_exit(example)
            if done.returncode != status or names not in done.stdout + done.stderr:
                failures.append(f"{example}\n  ran: {self.substituted(example)}\n  exit {done.returncode} "
                                f"(expected {status})\n  {(done.stderr or done.stdout).strip()[-1500:]}")
        return failures

    def job_ids(self) -> list[str]:
        """Every job and sweep in the store."""
        return sorted(p.name for p in self.store.iterdir() if not p.name.startswith(".")) \
            if self.store.is_dir() else []

    def settle(self, timeout: float = 300) -> dict[str, str]:
        """Wait for every job in the store to end; {job id: its final state} for those that did not complete and
        were not cancelled by an example."""
        wrong = {}
        for job_id in self.job_ids():
            done = self.shell(f"python -m hpcdl.jobs wait {job_id} --timeout {timeout}", timeout + 30)
            state = (done.stdout.strip().splitlines() or ["?"])[-1]
            cancelled = any(job_id == c or job_id.startswith(f"{c}_") for c in self.cancelled)  # a sweep's points
            if state != "COMPLETED" and not (state == "CANCELLED" and cancelled):
                wrong[job_id] = f"{state}: {done.stderr.strip()[-500:]}"
        return wrong


def expected_exit(example: Example) -> tuple[int, str]:
    return next((expected for key, expected in EXPECTED_EXIT.items() if key in example.text), (0, ""))
