"""Pace: each rank's own time per step against the median rank, stragglers flagged, effective training time."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcdl.distributed import pace
from hpcdl.store.files import PACE
from hpcdl.store.pace import goodput, rank_paces, read_pace
from tests.pace_parts import write_slow_net


def _samples(run: str, own_ms: list[float], start: float = 1000.0, every: float = 1.0) -> list[dict]:
    return [{"run": run, "at": start + every * (n + 1), "steps": 10 * (n + 1), "timed": 10,
             "step_s": 0.1, "exchange_s": 0.1 - ms / 1000, "wait_s": 0.01} for n, ms in enumerate(own_ms)]


def test_a_rank_slower_than_the_margin_for_its_window_is_a_straggler_and_noise_is_not() -> None:
    healthy = [20, 22, 19, 21, 23, 20, 18, 22, 21, 20, 19, 22]
    paces = {0: _samples("r", healthy), 1: _samples("r", [h * 1.1 for h in healthy]),
             2: _samples("r", [30, 31, 29, 32, 30, 33, 30, 31, 12, 30, 31, 30]),  # slow but for one sample
             3: _samples("r", healthy[:6] + [40] * 6),  # slow for the last 6 s only
             4: [{"run": "earlier", "at": 900.0, "steps": 1, "timed": 1, "step_s": 9.0, "wait_s": 0.0},
                 *_samples("r", healthy)]}
    views = {v.rank: v for v in rank_paces(paces, margin=0.2, window_s=10)}
    assert [r for r, v in views.items() if v.straggler] == [2]
    assert 0.65 < views[2].relative < 1 / 1.2 and views[2].slow_for_s >= 10
    assert not views[3].straggler and 5 <= views[3].slow_for_s <= 7  # flagged once slow for a whole window
    assert [r for r, v in {v.rank: v for v in rank_paces(paces, 0.2, 6)}.items() if v.straggler] == [2, 3]
    assert views[1].relative == 1.0 and views[0].relative == pytest.approx(1.1)  # the median: rank 1
    assert views[0].wait_share == pytest.approx(0.01) and views[0].steps_per_s == pytest.approx(10)


def test_effective_time_books_start_up_requeue_hold_and_redone_work_by_cause() -> None:
    lead = [{"run": "a", "at": 0.0, "event": "start"},
            {"run": "a", "at": 12.0, "steps": 1, "first_step_at": 10.0, "wait_s": 0.0},
            *[{"run": "a", "at": 10.0 + 10 * n, "steps": 100 * n, "timed": 100, "step_s": 0.1, "wait_s": 0.0}
              for n in range(1, 6)],  # 500 steps by t=60; killed (no end line)
            {"run": "b", "at": 100.0, "event": "start"},
            {"run": "b", "at": 110.0, "steps": 1, "first_step_at": 105.0, "wait_s": 0.0},
            {"run": "b", "at": 145.0, "steps": 300, "timed": 299, "step_s": 0.1, "wait_s": 0.0},
            {"run": "b", "at": 150.0, "event": "end"}]
    events = [{"event": "restarted", "at": 101.0, "iteration": 300, "restarts": 0, "slurm": "NODE_FAIL (n2)"}]
    result = goodput(lead, events, now=200.0, running=False)
    assert result.wall_s == 150.0
    lost = dict(result.lost)
    assert lost["start-up (imports, data, first step)"] == 10.0
    assert lost["restart start-up (checkpoint load, first step)"] == 5.0
    assert lost["work redone after restart by Slurm (NODE_FAIL (n2))"] == 20.0  # steps 300..500 of run a
    assert lost["held between runs: restart by Slurm (NODE_FAIL (n2))"] == 40.0
    assert lost["after the last step (validation, saving, exit)"] == 5.0
    assert result.productive_s == 30.0 + 40.0 and result.share == pytest.approx(70 / 150)
    assert result.wall_s == result.productive_s + sum(lost.values())
    assert goodput(lead[:1], events, now=200.0, running=True).wall_s == 0  # no step noted: no figure, not 0%


def test_the_recorder_writes_start_samples_and_end_with_the_exchange_taken_out(tmp_path: Path) -> None:
    class Done:
        def passed(self) -> bool:
            return True

        def seconds(self) -> float:
            return 0.004

    pace.start(tmp_path, 3, "run-1", window_s=1000)  # its thread samples every 30 s: the samples here are ours
    for _ in range(5):
        time.sleep(0.01)
        pace.step()
        pace.exchanged(Done())
        pace.waited(0.001)
    pace._recorder.sample()
    for _ in range(4):
        time.sleep(0.01)
        pace.step()
        pace.aside(0.002)
    pace.finish()
    lines = read_pace(tmp_path)[3]
    assert [line.get("event") for line in lines] == ["start", None, None, "end"]
    first, second = lines[1], lines[2]
    assert first["steps"] == 5 and first["timed"] == 4 and first["first_step_at"] <= first["at"]
    assert first["step_s"] >= 0.01 and first["exchange_s"] == pytest.approx(0.004) and first["wait_s"] == 0.005
    assert second["steps"] == 9 and second["timed"] == 4 and second["exchange_s"] == pytest.approx(0.002)
    assert oct((tmp_path / PACE / "rank3.jsonl").stat().st_mode & 0o777) == "0o600"


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def _show_after_run(cwd: Path, digits_root: Path, slow_rank: int) -> str:
    submitted = _cli(cwd, "hpcdl.submit", f"data.root={digits_root}", "training.max_epochs=2",
                     "training.mini_batch_size=16", "training.verbose=false", "training.execution_environment=parallel",
                     "cluster.tasks_per_node=2", "cluster.straggler_window_s=5", "model._target_=slownet.SlowNet",
                     f"+model.slow_rank={slow_rank}", "+model.busy_s=0.03")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split()[2]
    assert _cli(cwd, "hpcdl.jobs", "wait", job_id, "--timeout", "240").stdout.strip() == "COMPLETED"
    return _cli(cwd, "hpcdl.jobs", "show", job_id).stdout


def test_a_cpu_throttled_rank_is_flagged_as_a_straggler_and_a_healthy_run_is_not(
        store: Path, digits_root: Path, tmp_path: Path) -> None:
    user = write_slow_net(tmp_path / "user")
    slow = _show_after_run(user, digits_root, slow_rank=1)
    lines = {line.split()[1]: line for line in slow.splitlines() if line.startswith("  rank ")}
    assert "STRAGGLER" in lines["1"] and "STRAGGLER" not in lines["0"], slow
    assert "slower than the median rank" in lines["1"] and "effective " in slow, slow
    healthy = _show_after_run(user, digits_root, slow_rank=-1)
    assert "STRAGGLER" not in healthy and healthy.count("x median") == 2, healthy
    folder = store / sorted(p.name for p in store.iterdir() if not p.name.startswith("."))[-1]
    starts = [json.loads(line) for line in (folder / PACE / "rank0.jsonl").read_text().splitlines()][:1]
    assert starts[0]["event"] == "start" and starts[0]["host"]


def test_without_a_recorder_no_exchange_is_kept(monkeypatch) -> None:  # noqa: ANN001
    """train_network called directly (under torchrun, or in a script= job) starts no recorder: nothing may pile
    up step after step."""
    monkeypatch.setattr(pace, "_recorder", None)
    monkeypatch.setattr(pace, "_counts", pace._Counts())
    for _ in range(1000):
        pace.exchanged(object())  # type: ignore[arg-type]
    assert pace._counts.exchanges == []


def test_pace_lines_of_the_wrong_shape_are_left_out(tmp_path: Path) -> None:
    """A damaged pace file (valid JSON, wrong fields) gives no traceback in jobs show or watch."""
    from hpcdl.store.files import PACE, PACE_RANK
    from hpcdl.store.pace import rank_paces, read_pace

    (tmp_path / PACE).mkdir()
    good = {"run": "r", "at": 10.0, "step_s": 0.1, "timed": 5, "wait_s": 0.0, "host": "n1"}
    for rank, bad in ((0, {"run": "r", "at": 11.0, "step_s": 0.1}), (1, {"run": "r", "at": 11.0, "step_s": 0.1,
                                                                         "timed": 0, "wait_s": "x"})):
        lines = [good, bad]
        (tmp_path / PACE / PACE_RANK.format(rank=rank)).write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    views = rank_paces(read_pace(tmp_path), 0.2, 300)
    assert [v.rank for v in views] == [0, 1] and all(v.relative == 1.0 for v in views)
