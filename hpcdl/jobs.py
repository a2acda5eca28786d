"""python -m hpcdl.jobs: list, show, logs, watch, wait, cancel, fetch, resume and clean jobs, from any shell.

    python -m hpcdl.jobs list                  # the newest 50; also --state RUNNING, --name digits, --since 7d,
                                               # --limit N (0: all), --user U or --all (others', read-only), --points
    python -m hpcdl.jobs clean --older-than 30d --state FAILED --dry-run
    python -m hpcdl.jobs show ID               # ID: hpcdl id, a unique prefix, a Slurm job id, or last;
                                               # a sweep's id: its points' table (fetch: CSV and curves)
    python -m hpcdl.jobs logs ID -f --rank 0   # --stderr: the rank's stderr
    python -m hpcdl.jobs why ID                # the root-cause rank and its traceback, its victims, a hang's stacks
    python -m hpcdl.jobs stacks ID             # every rank's Python stack now, grouped
    python -m hpcdl.jobs watch ID              # --plot: its curves as text, and a PNG kept up to date
    python -m hpcdl.jobs wait ID --timeout 3600
    python -m hpcdl.jobs cancel ID
    python -m hpcdl.jobs fetch ID --to results/
    python -m hpcdl.jobs resume ID --time 02:00:00
    python -m hpcdl.jobs report ID             # one self-contained HTML page (a sweep: its trials' table)
    python -m hpcdl.jobs tensorboard ID        # the tensorboard command for its event files
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import time
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

from hpcdl.errors import HpcdlError
from hpcdl.store.states import CANCELLED, COMPLETED, PENDING, RUNNING, STOPPED, SUBMITTING, TIMEOUT

if TYPE_CHECKING:
    from hpcdl.store.folders import JobRecord
    from hpcdl.lifecycle.job import Job


def _clock(seconds: float) -> str:
    s = int(max(0, seconds))
    return f"{s // 86400}-{s // 3600 % 24:02d}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 86400 else \
        f"{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}"


def _elapsed(status: dict[str, Any]) -> str:
    started, ended = status.get("started_at"), status.get("ended_at") or time.time()
    if not isinstance(started, (int, float)) or not isinstance(ended, (int, float)):
        return ""
    return _clock(ended - started)


def _state(record: "JobRecord") -> str:
    """The state, and why a pending job waits: 'PENDING (Resources)'."""
    return f"{record.state} ({record.waiting_for})" if record.waiting_for else record.state


def _scheduler_id(record: "JobRecord") -> str:
    """The scheduler's id as its backend shows it; another user's job (read as JSON alone) as recorded."""
    from hpcdl.cluster import backend_for

    if "plan" not in record.manifest:
        return str(record.backend_id or "")
    return backend_for(record.backend).display_id(record)


def _row(record: "JobRecord") -> tuple[str, ...]:
    """One line of the listing; DAMAGED (and why on stderr) for a record whose content makes no sense."""
    from hpcdl.store.folders import DAMAGED
    from hpcdl.store.metrics import progress

    if record.state != DAMAGED:
        try:
            view = progress(record)
            fraction, best = view.get("fraction"), view.get("best_validation_accuracy")
            return (record.id, record.manifest["name"], record.manifest["profile"], _state(record),
                    "" if fraction is None else f"{100 * fraction:.0f}%", _elapsed(record.status),
                    "" if best is None else f"{100 * best:.2f}%", _scheduler_id(record))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            record.state, record.reason = DAMAGED, f"unexpected content: {type(e).__name__}: {e}"
    print(f"note: job {record.id} is DAMAGED ({record.reason}); its folder: {record.folder}", file=sys.stderr)
    name = record.manifest.get("name")
    return (record.id, name if isinstance(name, str) else "?", "", DAMAGED, "", "", "", "")


def _sweep_row(sweep: "JobRecord", points: list["JobRecord"]) -> tuple[str, ...]:
    """A sweep's line: its points counted by state, the best validation accuracy among them."""
    from hpcdl.store.metrics import progress

    best = []
    for point in points:
        with contextlib.suppress(KeyError, TypeError, ValueError, AttributeError):  # a damaged point: no value
            best.append(progress(point).get("best_validation_accuracy"))
    best = [b for b in best if isinstance(b, (int, float))]
    ended = [p.status.get("ended_at") for p in points]
    last = max(ended) if ended and all(isinstance(e, (int, float)) for e in ended) else time.time()
    done = sum(p.final for p in points)
    return (sweep.id, sweep.manifest["name"], sweep.manifest["profile"], sweep.state,
            f"{done}/{len(points)} done: {sweep.reason}", _clock(last - sweep.manifest["submitted_at"]),
            f"{100 * max(best):.2f}%" if best else "", _scheduler_id(sweep))


LIST_LIMIT = 50
"""How many jobs `jobs list` shows unless told (the newest): a lab's store holds 100,000."""


def cmd_list(args: argparse.Namespace) -> int:
    from hpcdl.store.folders import DAMAGED
    from hpcdl.lifecycle.listing import select
    from hpcdl.store.listing import parse_since, user_id

    selection = select(state=args.state, name=args.name, since=args.since and parse_since(args.since),
                       users=args.user and {user_id(args.user)}, everyone=args.all, limit=args.limit,
                       with_points=args.points)
    for note in selection.skipped:
        print(f"note: skipped {note}; not yours alone, never read", file=sys.stderr)
    from hpcdl.remote.records import remote_hint

    if (hint := remote_hint()) is not None:  # this store's jobs only: those on login nodes are listed there
        print(hint, file=sys.stderr)
    points = selection.points
    rows = [("ID", "NAME", "PROFILE", "STATE", "PROGRESS", "ELAPSED", "BEST VAL", "SCHEDULER ID")]
    rows += [_sweep_row(r, points[r.id]) if r.id in points and r.state != DAMAGED else _row(r)
             for r in selection.records]
    if selection.owners:  # other users' jobs asked for (--all, --user): whose each row is
        rows = [(*row, "OWNER" if n == 0 else selection.owners.get(row[0], "")) for n, row in enumerate(rows)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    if args.limit and len(selection.records) == args.limit:
        print(f"note: the newest {args.limit} shown; --limit N shows more, --limit 0 every one", file=sys.stderr)
    return 0


def cmd_clean(args: argparse.Namespace) -> int:
    from hpcdl.lifecycle.listing import clean
    from hpcdl.store.listing import parse_duration

    removed = clean(parse_duration(args.older_than), args.state, dry_run=args.dry_run)
    for record in removed:
        print(f"{'would remove' if args.dry_run else 'removed'} {record.id}  {record.state}  {record.manifest['name']}")
    print(f"{len(removed)} job(s) {'would be ' if args.dry_run else ''}removed")
    return 0


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def _sweep_points(folder: Path) -> tuple["JobRecord", list["JobRecord"]]:
    """A sweep's record and its points, asking the scheduler once: the points' states, then the sweep's."""
    from hpcdl.store.folders import DAMAGED, load_record
    from hpcdl.lifecycle.states import resolve_sweep

    sweep = load_record(folder)
    if sweep is None:
        raise HpcdlError(f"{folder}: the sweep's manifest is gone")
    return sweep, [] if sweep.state == DAMAGED else resolve_sweep(sweep, {})


def _show_sweep(folder: Path) -> int:
    from hpcdl.store.folders import DAMAGED
    from hpcdl.lifecycle.sweep_report import format_table, summary
    from hpcdl.store.sweeps import points_done

    sweep, points = _sweep_points(folder)
    if sweep.state == DAMAGED:
        return _show_damaged(sweep.id, sweep.reason, sweep.folder)
    m = sweep.manifest
    print(f"sweep     {sweep.id}  ('{m['name']}', {len(m['points'])} points)\n"
          f"state     {sweep.state}  ({points_done(sweep)})\n"
          f"profile   {m['profile']} ({sweep.backend}), scheduler id(s) {sweep.backend_id}\n"
          f"submitted {_when(m['submitted_at'])} from {m['submitted_from']['host']}:{m['submitted_from']['cwd']}\n"
          f"command   {' '.join(m.get('overrides') or []) or '-'}\n"
          f"folder    {sweep.folder}\n")
    print(format_table(summary(points)))
    return 0


def _show_damaged(job_id: str, reason: str, folder: Path) -> int:
    from hpcdl.store.folders import DAMAGED

    print(f"job       {job_id}\nstate     {DAMAGED}  ({reason})\nfolder    {folder}")
    return 1


def cmd_show(args: argparse.Namespace) -> int:
    """Everything known of a job; DAMAGED with the reason when a record's content is not of the shape written
    (the whole text is composed first: a damaged record prints no half of it)."""
    from hpcdl.lifecycle.job import Job

    job = Job.attach(args.id)
    text = io.StringIO()
    try:
        with contextlib.redirect_stdout(text):
            code = _show(job)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        return _show_damaged(job.id, f"unexpected content: {type(e).__name__}: {e}", job.folder)
    print(text.getvalue(), end="")
    return code


def _show(job: "Job") -> int:
    from hpcdl.store.folders import DAMAGED
    from hpcdl.store.sweeps import SWEEP

    if job.manifest.get("kind") == SWEEP:  # its points resolved once, with the sweep's state from theirs
        return _show_sweep(job.folder)
    record = job.refresh()
    if record.state == DAMAGED:
        return _show_damaged(record.id, record.reason, record.folder)
    m = record.manifest
    print(f"job       {record.id}  ({m['kind']} '{m['name']}')\n"
          f"state     {_state(record)}{'  (' + record.reason + ')' if record.reason else ''}\n"
          + _cause_line(job, record) +
          f"profile   {m['profile']} ({record.backend}), scheduler id {_scheduler_id(record) or '-'}\n"
          f"submitted {_when(m['submitted_at'])} from "
          f"{m['submitted_from']['host']}:{m['submitted_from']['cwd']}\n"
          f"elapsed   {_elapsed(record.status) or '-'}  host {record.status.get('host', '-')}  "
          f"restarts {record.status.get('restarts', 0)}\n"
          f"git       {(m.get('git') or {}).get('commit', '-')}"
          f"{' (dirty)' if (m.get('git') or {}).get('dirty') else ''}\n"
          f"overrides {' '.join(m.get('overrides') or []) or '-'}\n"
          f"folder    {record.folder}")
    code = m.get("snapshot")
    print(f"code      {code['files']} files, {code['bytes'] / 1024:.0f} KB of {code['from']}, run from the copy"
          if code else "code      not snapshotted (run from where it lies)")
    for event in record.status.get("events", []):
        slurm = f"; Slurm: {event['slurm']}" if "slurm" in event else ""
        print(f"{event['event']:<9} {_when(event['at'])} after iteration {event['iteration']} "
              f"(restart {event['restarts']}{slurm})")
        if event.get("failure"):
            print(f"          a rank of the run before: {event['failure']}")
    for resume in m.get("resumes", []):
        print(f"resumed   {_when(resume['at'])} after {resume['after']} (was {resume['backend_id']}), "
              f"time {resume['time']}")
    from hpcdl.lifecycle.pace_report import pace_lines
    from hpcdl.lifecycle.preflight_report import preflight_lines

    print("\n".join(preflight_lines(record) + (pace_lines(record) or ["pace      none recorded"])))
    _show_outcome(job, record)
    return 0


def cmd_why(args: argparse.Namespace) -> int:
    """The root-cause rank of a failed job with its traceback, its victims one line each, a hang's stacks."""
    from hpcdl.lifecycle.diagnosis import describe
    from hpcdl.lifecycle.job import Job

    job = Job.attach(args.id)
    record = job.refresh()
    verdict = job.verdict()
    print(f"job {record.id} {_state(record)}" + (f": {record.reason}" if record.reason else ""))
    told = describe(verdict)
    if told:
        print(told)
    elif record.state not in (RUNNING, PENDING, SUBMITTING) and record.state not in NOT_FAILED:
        print("no rank recorded a failure; what the job wrote last:\n" + job.error())
    else:
        print("no rank has failed" + (f"; its stacks now: python -m hpcdl.jobs stacks {record.id}"
                                      if record.state == RUNNING else ""))
    return 0


STACKS_WAIT_S = 20.0
"""How long jobs stacks waits for every rank's answer."""


def cmd_stacks(args: argparse.Namespace) -> int:
    """Ask every rank of a running job for its Python stacks and print them grouped by identical stack."""
    from hpcdl.distributed import stacks
    from hpcdl.lifecycle.job import Job

    job = Job.attach(args.id)
    record = job.refresh()
    if record.state != RUNNING:
        raise HpcdlError(f"job {record.id} is {_state(record)}: only a running job's ranks can give their stacks"
                         + (f" (its last ones: python -m hpcdl.jobs why {record.id})" if record.final else ""))
    world = record.plan.get("world_size", 1)
    found = stacks.collect(record.folder, stacks.request(record.folder), world, args.timeout)
    print(f"job {record.id}: stacks of {len(found)} of {world} rank(s)"
          + (f"; no answer from rank(s) {', '.join(str(r) for r in range(world) if r not in found)}"
             if len(found) < world else ""))
    odd = {tuple(ranks) for ranks, _ in stacks.outliers(stacks.groups(found))}
    for ranks, stack in stacks.groups(found):
        waits = stacks.in_collective(stack)
        print(f"--- {'OUTLIER ' if tuple(ranks) in odd else ''}rank{'s' if len(ranks) > 1 else ''} "
              f"{','.join(map(str, ranks))}" + (f" (waiting in {waits})" if waits else "") + " ---")
        print(stacks.format_stack(stack) or "(no frames)")
        for rank in ranks:
            if found[rank].get("script") and not stack:
                print(found[rank]["script"])
    return 0 if len(found) == world else 1


def _cause_line(job: "Job", record: "JobRecord") -> str:
    """'cause     rank R on HOST: its error' of a failed job with a recorded root cause; empty otherwise."""
    from hpcdl.lifecycle.diagnosis import headline

    if not record.final or record.state in NOT_FAILED:
        return ""
    told = headline(job.verdict())
    return f"cause     {told}  (python -m hpcdl.jobs why {record.id})\n" if told else ""


NOT_FAILED = (COMPLETED, CANCELLED, TIMEOUT, STOPPED)
"""Final states that are no error of the job: it completed, was cancelled, or reached its time limit."""


def _show_outcome(job: Any, record: "JobRecord") -> None:
    """Progress in words, the result and where it lies, and what comes next: for a failed job its error."""
    from hpcdl.store.files import CHECKPOINTS, RESULT, RESULTS, RESULTS_DIR, checkpoint_files
    from hpcdl.store.folders import FINAL_STATES, read_json
    from hpcdl.lifecycle.follow import progress_words
    from hpcdl.store.metrics import progress

    started = record.state not in (SUBMITTING, PENDING)
    words = progress_words(progress(record))
    print(f"progress  {words or ('none reported yet' if started else 'not started')}")
    if record.state == COMPLETED and record.manifest["kind"] == "train":
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):  # a damaged result.json: no line
            result = read_json(record.folder / RESULT) or {}
            accuracy, loss = result.get("validation_accuracy"), result.get("final_loss")
            print(f"result    {result.get('stop_reason')} after {result.get('iterations')} iterations"
                  + ("" if loss is None else f", final loss {loss:.4f}")
                  + ("" if accuracy is None else f", validation accuracy {100 * accuracy:.2f}%"))
    kept = [name for name in RESULTS if (record.folder / name).is_file()] if record.manifest["kind"] == "train" \
        else [f"{RESULTS_DIR}/"] if (record.folder / RESULTS_DIR).is_dir() else []
    if record.state == COMPLETED or kept:
        print(f"results   {', '.join(kept) or 'the return value'} in {record.folder}; a copy here: "
              f"python -m hpcdl.jobs fetch {record.id}")
    if started:
        ranks = record.plan.get("world_size", 1)
        print(f"logs      python -m hpcdl.jobs logs {record.id} [--stderr]"
              + (f" [--rank 0..{ranks - 1}]" if ranks > 1 else ""))
    if record.state in (TIMEOUT, STOPPED, CANCELLED) and (
            record.manifest["kind"] == "train" or checkpoint_files(record.folder / CHECKPOINTS)):
        print(f"resume    python -m hpcdl.jobs resume {record.id} goes on from its newest checkpoint")
    if record.state in FINAL_STATES and record.state not in NOT_FAILED:
        error = job.error()
        print("--- error ---\n" + (error or f"(nothing on rank 0's stderr; its output: python -m hpcdl.jobs logs "
                                            f"{record.id})"))


def cmd_logs(args: argparse.Namespace) -> int:
    from hpcdl.lifecycle.job import Job
    from hpcdl.store.safety import open_job_file

    job = Job.attach(args.id)
    _check_logs_asked(job, args.rank)
    log = job.log_path(args.rank, "stderr" if args.stderr else "stdout").relative_to(job.folder)
    offset, shown = 0, False
    while True:
        ended = args.follow and job.done()  # asked before reading: the last lines written are shown
        try:
            with open_job_file(job.folder, log) as f:
                f.seek(offset)
                chunk = f.read()
                offset = f.tell()
        except FileNotFoundError:
            chunk = b""
        sys.stdout.write(chunk.decode(errors="replace"))
        sys.stdout.flush()
        shown = shown or bool(chunk)
        if not args.follow or ended:
            if not shown:
                record = job.refresh()
                print(f"note: rank {args.rank} of job {job.id} ({_state(record)}) has written nothing to its "
                      f"{'stderr' if args.stderr else 'stdout'}" + ("" if record.final or record.state == RUNNING
                                                                     else ": it has not started yet"), file=sys.stderr)
            return 0
        time.sleep(1.0)


def _check_logs_asked(job: Any, rank: int) -> None:
    """HpcdlError for logs that cannot exist: a sweep's own (its points have them), a rank the job lacks."""
    from hpcdl.store.sweeps import SWEEP

    if job.manifest.get("kind") == SWEEP:
        points = job.manifest.get("points") or []
        raise HpcdlError(f"{job.id} is a sweep of {len(points)} point(s): each point has its logs, e.g. "
                         f"python -m hpcdl.jobs logs {points[0] if points else job.id + '_0'}")
    ranks = job.manifest["plan"].get("world_size", 1)
    if not 0 <= rank < ranks:
        raise HpcdlError(f"job {job.id} has {ranks} rank(s), numbered 0 to {ranks - 1}: there is no rank {rank}")


def cmd_watch(args: argparse.Namespace) -> int:
    from hpcdl.lifecycle.follow import follow
    from hpcdl.lifecycle.job import Job

    job = Job.attach(args.id)
    state = follow(job, extra=watch_plot(job, args.plot))
    _sweep_table(job)
    return 0 if state == COMPLETED else 1


def watch_plot(job: Any, path: Any) -> Any:
    """jobs watch --plot [PATH]: the progress plot kept in PATH (default ID-progress.png here) and the curves as
    text under the progress line; None without --plot."""
    from hpcdl.lifecycle.watch_plot import WatchPlot
    from hpcdl.store.files import WATCH_PLOT
    from hpcdl.store.sweeps import SWEEP

    if path is None:
        return None
    if job.manifest.get("kind") == SWEEP:
        raise HpcdlError(f"{job.id} is a sweep: --plot follows one job (a point: python -m hpcdl.jobs watch "
                         f"{job.id}_0 --plot), or see every point: python -m hpcdl.jobs report {job.id}")
    return WatchPlot(Path(path or WATCH_PLOT.format(id=job.id)).absolute())


def cmd_wait(args: argparse.Namespace) -> int:
    from hpcdl.lifecycle.follow import follow
    from hpcdl.lifecycle.job import Job
    from hpcdl.store.sweeps import SWEEP

    job = Job.attach(args.id)
    if job.manifest.get("kind") == SWEEP:  # k of N points done as they end, then their table
        state = follow(job, timeout=args.timeout)
        _sweep_table(job)
    else:
        state = job.wait(args.timeout)
    print(state)
    return 0 if state == COMPLETED else 1


def _sweep_table(job: Any) -> None:
    """A sweep's result table, once it has ended (nothing for a job)."""
    from hpcdl.lifecycle.sweep_report import format_table, summary
    from hpcdl.store.sweeps import SWEEP

    if job.manifest.get("kind") == SWEEP:
        print(format_table(summary(_sweep_points(job.folder)[1])))


def cmd_cancel(args: argparse.Namespace) -> int:
    from hpcdl.lifecycle.job import Job
    from hpcdl.store.states import FINAL_STATES
    from hpcdl.store.sweeps import SWEEP

    job = Job.attach(args.id)
    if args.point is not None:
        return cancel_point(job, args.point, args.timeout)
    if job.manifest.get("kind") != SWEEP and job.refresh().state in FINAL_STATES:
        print(f"{job.id} had already ended {job.state}: nothing to cancel")
        return 0
    if job.cancel():
        print(f"removed {job.id}: its submission had been interrupted, none of its points ran")
        return 0
    # a sweep's points are all final once cancel returns, and it settled their states: nothing to read again
    state = job.last_seen_state if job.manifest.get("kind") == SWEEP else job.wait(timeout=args.timeout)
    print(f"cancelled {job.id}; state now {state}")
    return 0


def cancel_point(sweep: Any, num: int, timeout: float) -> int:
    """Cancel one trial of a sweep (its other points go on); an error naming the points there are if it has
    no point ``num``."""
    from hpcdl.lifecycle.job import Job
    from hpcdl.store.sweeps import SWEEP, point_ids

    if sweep.manifest.get("kind") != SWEEP:
        raise HpcdlError(f"{sweep.id} is no sweep: --point names a trial of a sweep (cancel a job by its id alone)")
    points = point_ids(sweep.refresh())
    if not 0 <= num < len(points):
        raise HpcdlError(f"sweep {sweep.id} has {len(points)} point(s), numbered 0 to {len(points) - 1}: "
                         f"there is no point {num}")
    point = Job.attach(points[num])
    point.cancel()
    print(f"cancelled point {num} ({point.id}) of sweep {sweep.id}; state now {point.wait(timeout=timeout)}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Write the experiment page of a job or sweep."""
    from hpcdl.lifecycle.report_page import write_report

    started = time.perf_counter()
    path = write_report(args.id, Path(args.to).absolute() if args.to else None, args.metric)
    print(f"wrote {path} in {time.perf_counter() - started:.2f} s ({path.stat().st_size / 1e6:.2f} MB); open it "
          f"in a browser (no server needed), e.g. after: scp {os.uname().nodename}:{path} .")
    return 0


def cmd_tensorboard(args: argparse.Namespace) -> int:
    """Print the tensorboard command for a job's or a sweep's event files."""
    from hpcdl.lifecycle.report_page import tensorboard_command

    print(tensorboard_command(args.id, args.port))
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from hpcdl.lifecycle.job import Job
    from hpcdl.lifecycle.submission import resume_job

    job = resume_job(Job.attach(args.id), args.time)
    print(f"resumed {job.id} from its newest checkpoint as {job.backend_id}\n"
          f"  progress: python -m hpcdl.jobs watch {job.id}")
    return 0


def _fetch_sweep(job: Any, args: argparse.Namespace) -> int:
    """A sweep's summary table on screen, as CSV and its points' curves as PNG, in the target folder."""
    from hpcdl.store.folders import DAMAGED
    from hpcdl.store.safety import open_target
    from hpcdl.lifecycle.sweep_report import format_table, plot_curves, summary, write_csv
    from hpcdl.store.files import SUMMARY_CSV, SUMMARY_PLOT

    if args.wait:
        job.wait()
    sweep, points = _sweep_points(job.folder)
    if sweep.state == DAMAGED:
        raise HpcdlError(f"sweep {sweep.id} is DAMAGED ({sweep.reason}); its folder: {sweep.folder}")
    rows = summary(points)
    target = Path(args.to or job.id).absolute()  # not resolved: a link planted there is refused, not followed
    os.close(open_target(target))
    try:
        write_csv(rows, target / SUMMARY_CSV)
        plotted = plot_curves(points, target / SUMMARY_PLOT)
    except OSError as e:  # ELOOP: a link planted where the summary goes is never written through
        raise HpcdlError(f"cannot write the sweep's summary into {target}: {e.strerror or e}") from e
    print(format_table(rows))
    print(f"wrote {SUMMARY_CSV}{' and ' + SUMMARY_PLOT if plotted else ''} to {target}; each point's own "
          f"results: python -m hpcdl.jobs fetch POINT_ID")
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    from hpcdl.lifecycle.job import Job
    from hpcdl.store.safety import open_target
    from hpcdl.store.sweeps import SWEEP

    job = Job.attach(args.id)
    if job.manifest.get("kind") == SWEEP:
        return _fetch_sweep(job, args)
    result = job.result(timeout=0 if not args.wait else None)
    target = Path(args.to or job.id).absolute()  # not resolved: a link planted there is refused, not followed
    target_fd = open_target(target)
    try:
        _copy_results(job, result, target_fd, target)
    finally:
        os.close(target_fd)
    return 0


def _copy_results(job: Any, result: Any, target_fd: int, target: Path) -> None:
    """The job's results copied into the fetch target (see copy_out); its summary or result printed."""
    from hpcdl.store.files import METRICS, PLOT, RESULTS, RESULTS_DIR
    from hpcdl.store.safety import copy_out

    if job.manifest["kind"] == "train":
        from hpcdl.lifecycle.follow import format_summary

        copied = []
        for name in RESULTS:
            with contextlib.suppress(FileNotFoundError):
                copy_out(job.folder, name, target_fd, target)
                copied.append(name)
        print(format_summary(result))
        print(f"copied {', '.join(copied)} to {target}\n"
              f"load: model, info, summary = hpcdl.train.job.load_result({str(target)!r})")
    else:  # the user's code: its result, its results folder, what it reported
        names = [PurePath(name) for name in (METRICS, PLOT)]
        for top, _, files in os.walk(job.folder / RESULTS_DIR):  # links are neither followed nor copied
            names += [PurePath(top, name).relative_to(job.folder) for name in files]
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                copy_out(job.folder, name, target_fd, target)
        print(repr(result))
        print(f"copied the results folder and reports to {target}")


def _state_name(text: str) -> str:
    """A state to list by, in capitals; an unknown one (DONE, say) is refused naming those there are."""
    from hpcdl.store.states import STATES

    if text.upper() not in STATES:
        raise argparse.ArgumentTypeError(f"no state {text!r}: one of {', '.join(STATES)} (a job that ended "
                                         "well is COMPLETED)")
    return text.upper()


def parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per verb."""
    from hpcdl.store.files import WATCH_PLOT

    top = argparse.ArgumentParser(prog="python -m hpcdl.jobs", description=__doc__.splitlines()[0],
                                  formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    verbs = top.add_subparsers(dest="verb", required=True)
    listing = verbs.add_parser("list", help="a table of jobs")
    listing.add_argument("--state", type=_state_name, help="only jobs in this state (RUNNING, FAILED, ...)")
    listing.add_argument("--name", help="only jobs whose name matches (substring or glob)")
    listing.add_argument("--limit", type=int, default=LIST_LIMIT,
                         help=f"only the newest N (default {LIST_LIMIT}; 0: every job)")
    listing.add_argument("--since", help="only jobs submitted since a date (2026-12-01) or a time ago (7d, 12h)")
    listing.add_argument("--user", help="only this user's jobs (read-only: never cancelled or unpickled)")
    listing.add_argument("--all", action="store_true", help="every user's jobs in the stores (read-only)")
    listing.add_argument("--points", action="store_true", help="list each sweep's points too")
    listing.set_defaults(run=cmd_list)
    cleaning = verbs.add_parser("clean", help="remove your jobs that ended long ago")
    cleaning.add_argument("--older-than", required=True, help="ended more than this long ago: 30d, 12h, ...")
    cleaning.add_argument("--state", type=_state_name,
                          help="only jobs that ended in this state (FAILED, CANCELLED, ...)")
    cleaning.add_argument("--dry-run", action="store_true", help="only say which jobs would be removed")
    cleaning.set_defaults(run=cmd_clean)
    for verb, run, text in (("show", cmd_show, "everything known of a job"),
                            ("watch", cmd_watch, "live progress until the job ends"),
                            ("wait", cmd_wait, "block until the job ends; exit 0 if it completed"),
                            ("cancel", cmd_cancel, "cancel a job"),
                            ("fetch", cmd_fetch, "copy the results here and print the summary"),
                            ("resume", cmd_resume, "submit a stopped training job again; it goes on from its "
                                                   "newest checkpoint"),
                            ("logs", cmd_logs, "a rank's stdout or stderr"),
                            ("why", cmd_why, "why the job failed: the root-cause rank first, its victims, a hang's "
                                             "stacks"),
                            ("stacks", cmd_stacks, "every rank's Python stack of a running job, grouped"),
                            ("report", cmd_report, "write one self-contained HTML page of a job or sweep (a sweep: "
                                                   "its trials' table, curves, confusion matrices, definition)"),
                            ("tensorboard", cmd_tensorboard, "print the tensorboard command for a job's or sweep's "
                                                             "event files, and the ssh line to forward its port")):
        sub = verbs.add_parser(verb, help=text, description=text)
        sub.add_argument("id", metavar="ID", help="the job's hpcdl id, a unique prefix of it, its Slurm job id, "
                                                  "or 'last' (your newest job)")
        sub.set_defaults(run=run)
        if verb == "logs":
            sub.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
            sub.add_argument("--rank", type=int, default=0, metavar="N",
                             help="the rank whose log to print, from 0 (default 0)")
            sub.add_argument("--stderr", action="store_true", help="stderr instead of stdout")
        if verb == "watch":
            sub.add_argument("--plot", nargs="?", const="", metavar="PNG",
                             help=f"keep the progress plot in PNG (default {WATCH_PLOT.format(id='ID')} here) as "
                                  "the job goes, and show its curves as text under the progress line")
        if verb == "wait":
            sub.add_argument("--timeout", type=float, default=None, metavar="S",
                             help="give up after this many seconds, exit 1 (default: wait as long as it runs)")
        if verb == "cancel":
            sub.add_argument("--timeout", type=float, default=60.0, metavar="S",
                             help="seconds to wait for the job to end after cancelling it (default 60)")
            sub.add_argument("--point", type=int, metavar="N", help="cancel only point N of the sweep ID")
        if verb == "stacks":
            sub.add_argument("--timeout", type=float, default=STACKS_WAIT_S, metavar="S",
                             help=f"seconds to wait for every rank's answer (default {STACKS_WAIT_S:g})")
        if verb == "report":
            sub.add_argument("--to", help="the HTML file to write (default: report.html in the job's folder)")
            sub.add_argument("--metric", help="a sweep's best trial by this column (default: the best validation "
                                              "accuracy, else the value, accuracy or loss)")
        if verb == "tensorboard":
            sub.add_argument("--port", type=int, default=6006, help="the port tensorboard serves on (default 6006)")
        if verb == "resume":
            sub.add_argument("--time", help="a new time limit (Slurm's format, e.g. 02:00:00)")
        if verb == "fetch":
            sub.add_argument("--to", help="folder to copy into (default ./ID)")
            sub.add_argument("--wait", action="store_true", help="wait for the job to end first")
    return top


def main(argv: list[str]) -> int:
    from hpcdl.remote.routing import goes_remote

    if goes_remote(argv):  # cluster=NAME of a remote profile, or a job submitted from here to one: its login node
        from hpcdl.remote.client import jobs_remote

        try:
            return jobs_remote(argv)
        except (HpcdlError, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except (HpcdlError, TimeoutError, OSError) as e:  # OSError: a store or folder moved away meanwhile
        print(f"error: {e}", file=sys.stderr)
        return 1


def cli() -> None:
    """Console-script entry point."""
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    cli()
