"""The shape of hpcdl/ as its imports draw it: one way down, no circle; every job-folder file and state named once.

Each package of hpcdl/ (``store``, ``cluster``, ...) and each top-level module (``plan``, ``worker``, ...) is one
unit; an import anywhere in a file (inside a function or under TYPE_CHECKING too) is an arrow from its unit to the
imported one. The units stand in LAYERS, lowest first: an arrow may point down or across a layer, never up, and
no arrows may close a circle; nor may the modules' own arrows, inside a package or between them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Iterator

PACKAGE = Path(__file__).resolve().parent.parent / "hpcdl"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "host", "gpus"),  # what every layer may use: the error tree, this machine, its GPUs
    ("store",),  # THE FLOOR: the job folder on disk, every file and state name; no backend, no torch
    ("view",),  # a run's plot, TensorBoard events and experiment page, drawn from its records alone
    ("models",),  # the registry of built-in networks (names; torch only once one is built)
    ("config",),  # the typed tree, composition, help
    ("data",),  # rank side: datastores, batches, augmentation
    ("distributed",),  # rank side: discovery, process groups, heartbeats, a job's runs; the share rules
    ("plan",),  # resolve(config) -> JobPlan: what the ranks run
    ("train",),  # rank side: the loop and its parts; run_training(plan, folder)
    ("snapshot", "resumable", "reporting"),  # what a rank's (user) code calls, and the code snapshot it runs
    ("usercode",),  # a rank running the user's function, entry point or script
    ("cluster",),  # the backends: the only code that knows a scheduler's commands; they start the worker by name
    ("worker",),  # the job side: a job folder run on the node, asking its backend (requeue, how a stop ends)
    ("lifecycle",),  # a job's life from the login node: submit, states, following, the Job handle, sweep reports
    ("sweep",),  # sweeps as Hydra runs them
    ("remote",),  # the client of a login node over SSH: submit and the jobs commands run there
    ("submit", "jobs", "run", "devices", "agent", "profiles", "doctor", "pool"),  # the command lines: parse, call, print
    ("hpcdl",),  # the public API (hpcdl/__init__.py)
)
LAYER = {unit: level for level, units in enumerate(LAYERS) for unit in units}


def _unit(module: str) -> str:
    """The unit of a dotted module name of hpcdl: its package or top-level module ('hpcdl' for the API)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "hpcdl"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path) -> Iterator[tuple[str, int]]:
    """(module of hpcdl, line) of every import in ``path``, wherever it stands; the public API's lazy exports too."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1], *filter(None, [base])])
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        elif path == PACKAGE / "__init__.py" and isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value] if re.fullmatch(r"hpcdl(\.\w+)+", node.value) else []
        else:
            continue
        for name in names:
            if name.split(".")[0] == "hpcdl" and name != "hpcdl":
                yield name, node.lineno


def unit_arrows() -> dict[tuple[str, str], list[str]]:
    """(from unit, to unit) -> the places ('file:line') of the imports that draw the arrow."""
    arrows: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        source = _unit(_module(path))
        for name, line in _imported(path):
            target = _unit(name)
            if target != source:
                arrows.setdefault((source, target), []).append(f"{path.relative_to(PACKAGE.parent)}:{line}")
    return arrows


def circles(arrows: dict[tuple[str, str], list[str]]) -> list[list[str]]:
    """The groups of units that reach each other (Tarjan's strongly connected components of two or more)."""
    graph: dict[str, set[str]] = {}
    for source, target in arrows:
        graph.setdefault(source, set()).add(target)
        graph.setdefault(target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(unit: str) -> None:
        index[unit] = low[unit] = len(index)
        stack.append(unit)
        for other in sorted(graph[unit]):
            if other not in index:
                visit(other)
                low[unit] = min(low[unit], low[other])
            elif other in stack:
                low[unit] = min(low[unit], index[other])
        if low[unit] == index[unit]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == unit:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for unit in sorted(graph):
        if unit not in index:
            visit(unit)
    return found


def test_every_package_and_module_has_a_layer() -> None:
    units = {_unit(_module(path)) for path in PACKAGE.rglob("*.py")}
    assert units - set(LAYER) == set(), "place each new package or top-level module in LAYERS"
    assert set(LAYER) - units == set(), "LAYERS names units that are gone"


def test_no_import_circle_between_packages() -> None:
    arrows = unit_arrows()
    assert circles(arrows) == []


def test_no_arrow_from_a_lower_layer_to_a_higher_one() -> None:
    upward = {f"{source} -> {target}": places for (source, target), places in unit_arrows().items()
              if LAYER[source] < LAYER[target]}
    assert upward == {}


def module_arrows() -> dict[tuple[str, str], list[str]]:
    """(from module, to module) -> the places of the imports that draw the arrow, between the modules of hpcdl
    (a name imported from a module is an arrow to that module)."""
    modules = {_module(path) for path in PACKAGE.rglob("*.py")}
    arrows: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        source = _module(path)
        for name, line in _imported(path):
            target = name if name in modules else name.rpartition(".")[0]
            if target in modules and target != source:
                arrows.setdefault((source, target), []).append(f"{path.relative_to(PACKAGE.parent)}:{line}")
    return arrows


def test_no_import_circle_between_the_modules_of_a_package() -> None:
    assert circles(module_arrows()) == []


def test_the_store_imports_nothing_of_hpcdl_but_errors_and_host() -> None:
    assert {target for source, target in unit_arrows() if source == "store"} <= {"errors", "host"}


FILES = PACKAGE / "store" / "files.py"
"""Every name of a file or folder in a job folder (and in the store beside them)."""
STATES = PACKAGE / "store" / "states.py"
"""Every state name: hpcdl's and the scheduler's."""
FILE_NAME = re.compile(r"\.(json|jsonl|pkl|pt|png|csv|log|out|err|sh)\b")
"""A literal naming a file by its ending."""
ORDINARY_WORDS = {"code", "logs", "results", "slurm", "sweep", "tensorboard"}
"""Names of files.py that are words of other meanings too (a backend, a manifest kind, a package and a `jobs`
verb): not searched for alone."""
OTHER_FILES = {
    "hpcdl/data/listing.py": "image files a datastore reads, not job files",
    "hpcdl/data/digits.py": "image files of the example data set",
    "hpcdl/train/speed.py": "the compile-time record beside the inductor cache, outside any job folder",
    "hpcdl/cluster/slurm.py": "submitit's own names in the job's slurm/ folder (%A_%a_%t_log.out), array scripts",
}


def _literals(path: Path) -> Iterator[tuple[str, int]]:
    """Every string constant of ``path`` but its docstrings (and other bare string statements), with its line."""
    tree = ast.parse(path.read_text(), str(path))
    bare = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in bare:
            yield node.value, node.lineno


def _defined(path: Path, alone: bool) -> set[str]:
    """The string values that ``path`` assigns to names at module level: alone (``NAME = "value"``), or anywhere
    in the value (tuples, dicts)."""
    values = set()
    for statement in ast.parse(path.read_text()).body:
        if isinstance(statement, (ast.Assign, ast.AnnAssign)) and statement.value is not None:
            values |= {node.value for node in ([statement.value] if alone else ast.walk(statement.value))
                       if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    return values


def _elsewhere(defining: Path, wanted: "callable") -> list[str]:
    return [f"{path.relative_to(PACKAGE.parent)}:{line}: {value!r}" for path in sorted(PACKAGE.rglob("*.py"))
            if path != defining for value, line in _literals(path) if wanted(path, value)]


def test_every_job_folder_file_name_is_defined_in_files_py() -> None:
    names = {name for name in _defined(FILES, alone=True) if re.fullmatch(r"[\w.-]+", name)} - ORDINARY_WORDS
    assert _elsewhere(FILES, lambda path, value: str(path.relative_to(PACKAGE.parent)) not in OTHER_FILES
                      and (value in names or FILE_NAME.search(value) is not None)) == []


PATH_JOINS_ELSEWHERE = {"hpcdl/agent.py": "the agent's own transfer folder (work / 'code'), not a job folder's"}
"""Files that join a path with a name files.py defines for something else."""


def test_no_path_is_joined_with_a_job_folder_name_written_out() -> None:
    """``folder / "slurm"``: a literal joined onto a path is a job-folder name however ordinary the word (the
    literal check above leaves ordinary words alone)."""
    names = {name for name in _defined(FILES, alone=True) if re.fullmatch(r"[\w.-]+", name)} | {".hydra"}
    joined = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.right.value!r}"
              for path in sorted(PACKAGE.rglob("*.py")) if path != FILES
              and str(path.relative_to(PACKAGE.parent)) not in PATH_JOINS_ELSEWHERE
              for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.BinOp)
              and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant) and node.right.value in names]
    assert joined == []


def test_every_state_name_is_defined_in_states_py() -> None:
    names = {name for name in _defined(STATES, alone=False) if re.fullmatch(r"[A-Z][A-Z_]{3,}", name)}
    assert names >= {"SUBMITTING", "PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "DAMAGED"}
    assert _elsewhere(STATES, lambda path, value: value in names) == []


BACKEND_NAMES = {"local", "slurm"}
SCHEDULER_COMMANDS = {"sbatch", "srun", "scancel", "squeue", "sacct", "sacctmgr", "scontrol", "sinfo"}
SCHEDULER_VARIABLE = re.compile(r"\bSLURM_[A-Z]")
"""A literal naming one of Slurm's environment variables (SLURM_JOB_ID, SLURM_RESTART_COUNT, ...)."""
ASKS_OUTSIDE_CLUSTER = {
    "hpcdl/config/cluster.py": "SLURM_CONF among the variables a job takes from the submitting shell by default "
                               "(a name the profile passes on, never read here)",
    "hpcdl/distributed/env.py": "rank side: a rank that srun started finds its rank, world and first node's "
                                "address from srun's task variables (scontrol show node), as one that mpirun "
                                "started does from Open MPI's: the launcher's variables, read where the others are",
}
"""The places outside cluster/ that still know a backend or read its variables, each with why."""


def test_no_code_outside_cluster_asks_which_backend_it_has() -> None:
    asked = []
    for path in sorted(PACKAGE.rglob("*.py")):
        place = str(path.relative_to(PACKAGE.parent))
        if place.startswith("hpcdl/cluster/") or place in ASKS_OUTSIDE_CLUSTER:
            continue
        tree = ast.parse(path.read_text(), place)
        for node in ast.walk(tree):
            equal = isinstance(node, ast.Compare) and all(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops)
            compared = [node.left, *node.comparators] if equal else []
            if any(isinstance(side, ast.Constant) and side.value in BACKEND_NAMES for side in compared):
                asked.append(f"{place}:{node.lineno}: compares a backend's name")
        asked += [f"{place}:{line}: runs {value!r}" for value, line in _literals(path) if value in SCHEDULER_COMMANDS]
        asked += [f"{place}:{line}: reads {value!r}" for value, line in _literals(path)
                  if SCHEDULER_VARIABLE.search(value)]
    assert asked == []


def test_the_exceptions_outside_cluster_are_still_needed() -> None:
    """Each file ASKS_OUTSIDE_CLUSTER lets through still runs a scheduler's command, reads its variables or
    compares a backend's name: an exception that is no longer taken is taken off the list."""
    for place in ASKS_OUTSIDE_CLUSTER:
        path = PACKAGE.parent / place
        values = [value for value, _ in _literals(path)]
        tree = ast.parse(path.read_text(), place)
        names = [node.value for node in ast.walk(tree) if isinstance(node, ast.Compare)
                 for node in [node.left, *node.comparators] if isinstance(node, ast.Constant)]
        assert (any(value in SCHEDULER_COMMANDS or SCHEDULER_VARIABLE.search(value) for value in values)
                or any(name in BACKEND_NAMES for name in names)), f"{place} no longer needs its exception"


def test_the_readmes_layout_names_every_unit_and_every_module_of_the_backends_and_the_lifecycle() -> None:
    """A newcomer finds each room in the README's Layout: every top-level module and package of hpcdl, and each
    module of cluster/ and lifecycle/ (where a backend or a login-node command is added)."""
    readme = (PACKAGE.parent / "README.md").read_text()
    layout = readme[readme.index("\n## Layout\n"):]
    layout = layout[:layout.find("\n## ", 1)] if "\n## " in layout[1:] else layout
    units = [p for p in PACKAGE.iterdir() if not p.name.startswith("_") and p.name != "conf"
             and (p.suffix == ".py" or (p / "__init__.py").exists())]
    missing = [f"hpcdl/{p.name}" + ("" if p.suffix else "/") for p in units
               if (f"`hpcdl/{p.name}`" if p.suffix else f"`hpcdl/{p.name}/`") not in layout]
    for package in ("cluster", "lifecycle"):
        missing += [f"hpcdl/{package}/{p.name}" for p in (PACKAGE / package).glob("[!_]*.py")
                    if f"`{p.name}`" not in layout and f"{package}/{p.name}`" not in layout]
    assert not missing, f"README's Layout names none of: {', '.join(sorted(missing))}"
