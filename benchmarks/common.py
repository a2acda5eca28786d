"""What every benchmark shares: writing its figures to a JSON file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_result(path: str, result: dict[str, Any]) -> None:
    """Write ``result`` as indented JSON to ``path`` (folders made as needed)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=2) + "\n")
