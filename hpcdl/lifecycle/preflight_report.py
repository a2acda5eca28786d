"""A job's preflight in words (jobs show): the nodes its submission left out and why, each node's checks, the
failed ones named, an excluded node said."""

from __future__ import annotations

import json

from hpcdl.store.files import PREFLIGHT
from hpcdl.store.folders import JobRecord
from hpcdl.store.safety import read_job_file


def preflight_lines(record: JobRecord) -> list[str]:
    """One line per node the submission left out (the manifest's ``excluded``), then per node that ran its
    preflight (none when no node did); a node's file of the wrong shape is said to be so."""
    folder = record.folder / PREFLIGHT
    excluded = record.manifest.get("excluded")
    lines = [f"excluded {node}: {' '.join(reason.split())}" for node, reason in sorted(excluded.items())
             if isinstance(node, str) and isinstance(reason, str)] if isinstance(excluded, dict) else []
    for name in sorted(p.name for p in folder.iterdir()) if folder.is_dir() else ():
        try:
            result = json.loads(read_job_file(record.folder, f"{PREFLIGHT}/{name}") or b"{}")
            checks = result["checks"]
            failed = [f"{c['name']} ({c['detail']})" for c in checks if c["status"] == "failed"]
            passed = [c["name"] for c in checks if c["status"] == "passed"]
            skipped = [c["name"] for c in checks if c["status"] == "skipped"]
            warned = [f"{c['name']} ({c['detail']})" for c in checks if c["status"] == "warned"]
            words = (f"FAILED {'; '.join(failed)}" if failed else "passed") + \
                f" in {result['seconds']:.1f} s ({', '.join(passed) or 'none'} passed" + \
                (f"; {', '.join(skipped)} skipped" if skipped else "") + ")"
            if "busbw_gbps" in result:
                words += f"; all-reduce {float(result['busbw_gbps']):.2f} GB/s"
            if warned:
                words += f"; WARNING {'; '.join(warned)}"
            if result.get("excluded"):
                words += f"; excluded: the job was queued again without {result['node']}"
            lines.append(f"preflight {result['node']}: {words}")
        except (ValueError, KeyError, TypeError) as e:
            lines.append(f"preflight {name}: unreadable ({type(e).__name__})")
    return lines
