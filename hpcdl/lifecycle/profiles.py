"""The cluster profiles this machine finds (the user's, the site's, hpcdl's own), and one checked against its
live cluster: what the scheduler offers, and whether it can run what the profile asks for."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from hpcdl.cluster import backend_for
from hpcdl.config.cluster import time_limit_seconds
from hpcdl.config.compose import CONF_DIR, compose_config, profile_file, site_config_dir, user_config_dirs
from hpcdl.config.environment import job_environment
from hpcdl.errors import HpcdlError
from hpcdl.plan import JobPlan


@dataclass(frozen=True)
class FoundProfile:
    """A profile file that composition picks for its name, and the files of the same name it hides."""

    name: str
    source: str
    """yours, site or built in."""
    path: Path
    backend: str
    host: Optional[str] = None
    """The login node of a remote profile."""
    hides: tuple[str, ...] = field(default_factory=tuple)


def _folders() -> list[tuple[Path, str]]:
    site = site_config_dir()
    return [*((d, "yours") for d in user_config_dirs()), *([(site, "site")] if site else []), (CONF_DIR, "built in")]


def found_profiles() -> list[FoundProfile]:
    """Every profile name found, with the file that wins (the user's before the site's before hpcdl's)."""
    import yaml

    places: dict[str, list[tuple[Path, str]]] = {}
    for folder, source in _folders():
        for path in sorted((folder / "cluster").glob("*.yaml")):
            places.setdefault(path.stem, []).append((path, source))
    found = []
    for name, files in sorted(places.items()):
        (path, source), hidden = files[0], files[1:]
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as e:
            data = {"backend": f"? ({type(e).__name__})"}
        data = data if isinstance(data, dict) else {}
        remote = data.get("remote") if isinstance(data.get("remote"), dict) else {}
        found.append(FoundProfile(name, source, path, str(data.get("backend", "local")), remote.get("host"),
                                  tuple(source for _, source in hidden)))
    return found


def check_profile(overrides: Sequence[str]) -> tuple[list[str], Optional[str]]:
    """What the profile asks for, its network settings and what the cluster offers (lines), and the first
    thing the cluster cannot run (or None)."""
    profile = compose_config(overrides).cluster
    names = [o.partition("=")[2] for o in overrides if o.partition("=")[0] == "cluster"]
    lines = [f"profile   {profile.name} ({profile.backend}) from {profile_file(names[-1]) if names else 'default'}",
             f"asks for  {profile.nodes} node(s) x {profile.tasks_per_node} task(s), {profile.gpus_per_node} GPU(s) "
             f"and {profile.cpus_per_task or 'default'} CPU(s) per task, time {profile.time}, partition "
             f"{profile.partition or '(the default)'}"]
    network = job_environment(profile)
    lines.append("network   " + (" ".join(f"{k}={v}" for k, v in sorted(network.items())) or "NCCL's defaults"))
    backend = backend_for(profile.backend)
    world = profile.nodes * profile.tasks_per_node
    plan = JobPlan(kind="function", name="check", cluster=profile, world_size=world, worker_loads=(1.0,) * world,
                   time_limit_s=time_limit_seconds(profile.time), environment=network)
    try:
        lines += ["", *backend.survey()]
        backend.check(plan)
    except HpcdlError as e:
        return lines, str(e)
    return lines, None
