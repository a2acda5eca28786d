"""python -m hpcdl.jobs: list, show, logs, watch, wait, cancel, fetch, resume and clean jobs, from any shell.

    python -m hpcdl.jobs list                  # also --state RUNNING, --name digits, --since 7d, --limit N,
                                               # --user U or --all (others' jobs, read-only), --points
    python -m hpcdl.jobs clean --older-than 30d --state FAILED --dry-run
    python -m hpcdl.jobs show ID               # ID: hpcdl id, a unique prefix, a Slurm job id, or last;
                                               # a sweep's id: its points' table (fetch: CSV and curves)
    python -m hpcdl.jobs logs ID -f --rank 0   # --stderr: the rank's stderr
    python -m hpcdl.jobs watch ID
    python -m hpcdl.jobs wait ID --timeout 3600
    python -m hpcdl.jobs cancel ID
    python -m hpcdl.jobs fetch ID --to results/
    python -m hpcdl.jobs resume ID --time 02:00:00
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


def cmd_list(args: argparse.Namespace) -> int:
    from hpcdl.store.folders import DAMAGED
    from hpcdl.lifecycle.listing import select
    from hpcdl.store.listing import parse_since, user_id

    selection = select(state=args.state, name=args.name, since=args.since and parse_since(args.since),
                       users=args.user and {user_id(args.user)}, everyone=args.all, limit=args.limit,
                       with_points=args.points)
    for note in selection.skipped:
        print(f"note: skipped {note}; not yours alone, never read", file=sys.stderr)
    points = selection.points
    rows = [("ID", "NAME", "PROFILE", "STATE", "PROGRESS", "ELAPSED", "BEST VAL", "SCHEDULER ID")]
    rows += [_sweep_row(r, points[r.id]) if r.id in points and r.state != DAMAGED else _row(r)
             for r in selection.records]
    if selection.owners:  # other users' jobs asked for (--all, --user): whose each row is
        rows = [(*row, "OWNER" if n == 0 else selection.owners.get(row[0], "")) for n, row in enumerate(rows)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
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
    state = follow(job)
    _sweep_table(job)
    return 0 if state == COMPLETED else 1


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

    job = Job.attach(args.id)
    if job.cancel():
        print(f"removed {job.id}: its submission had been interrupted, none of its points ran")
        return 0
    print(f"cancelled {job.id}; state now {job.wait(timeout=args.timeout)}")
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
    top = argparse.ArgumentParser(prog="python -m hpcdl.jobs", description=__doc__.splitlines()[0],
                                  formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    verbs = top.add_subparsers(dest="verb", required=True)
    listing = verbs.add_parser("list", help="a table of jobs")
    listing.add_argument("--state", type=_state_name, help="only jobs in this state (RUNNING, FAILED, ...)")
    listing.add_argument("--name", help="only jobs whose name matches (substring or glob)")
    listing.add_argument("--limit", type=int, default=0, help="only the newest N")
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
                            ("logs", cmd_logs, "a rank's stdout or stderr")):
        sub = verbs.add_parser(verb, help=text, description=text)
        sub.add_argument("id", metavar="ID", help="the job's hpcdl id, a unique prefix of it, its Slurm job id, "
                                                  "or 'last' (your newest job)")
        sub.set_defaults(run=run)
        if verb == "logs":
            sub.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
            sub.add_argument("--rank", type=int, default=0, metavar="N",
                             help="the rank whose log to print, from 0 (default 0)")
            sub.add_argument("--stderr", action="store_true", help="stderr instead of stdout")
        if verb == "wait":
            sub.add_argument("--timeout", type=float, default=None, metavar="S",
                             help="give up after this many seconds, exit 1 (default: wait as long as it runs)")
        if verb == "cancel":
            sub.add_argument("--timeout", type=float, default=60.0, metavar="S",
                             help="seconds to wait for the job to end after cancelling it (default 60)")
        if verb == "resume":
            sub.add_argument("--time", help="a new time limit (Slurm's format, e.g. 02:00:00)")
        if verb == "fetch":
            sub.add_argument("--to", help="folder to copy into (default ./ID)")
            sub.add_argument("--wait", action="store_true", help="wait for the job to end first")
    return top


def main(argv: list[str]) -> int:
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
