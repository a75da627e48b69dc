"""Run the fault suite (tests marked `faults`) and write docs/reliability.md from what it measured.

    .venv/bin/python scripts/reliability_report.py        # or: make reliability

Each fault test records one line (fault, behaviour, records lost, duplicated, recovered, figures)
through the fault_outcome fixture in tests/conftest.py; this script only runs them and renders
the table, so the document always shows the last run's figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "reliability.md"

HEADER = """# Reliability: faults injected mid-run

Every row is a test in `tests/test_faults.py`, `tests/test_state_faults.py`,
`tests/test_direct_faults.py` or `tests/test_sql_direct.py` (marker `faults`)
that breaks a real part in the middle of a run (a process killed with SIGKILL, the broker frozen,
a PostgreSQL connection terminated from another session, a full disk) on the embedded broker,
PostgreSQL and a real Spark session, then checks the target topic's content and the stored
offsets. *Lost* and *duplicated* count source records against what the target holds after the
recovery; *recovered* means the next run completed on its own, with nothing done by hand unless the
behaviour says so.

Regenerate: `make reliability` (runs the suite and rewrites this file).

"""

FOOTER = """
## What the figures say

- **Nothing is lost.** Offsets move only after the sink acknowledged every message they cover and
  the state store committed them; every fault above leaves them at most where the failed run had
  delivered without a gap, so the rerun sends everything after that.
- **Duplicates are bounded by what was open.** Delivery is at-least-once: a run that fails
  after producing is produced again by the rerun from its stored offsets. On the direct path
  (Kafka JSON → Kafka JSON) a slice starts only while fewer than the window (the task slots; on a
  cluster or Spark Connect the driver's own count) are open — running, or delivered behind a
  slower slice — and each partition's offset is stored as its slices are delivered, so the
  duplicates are at most the window × `records_per_task`, however the slices finish (3b, 3d). A
  batch where keep_last / keep_first left records out is stored once, whole: a rerun must see the
  kept record again to pick it (3c). On the Spark SQL path the state moves once, with the whole
  batch, so they are at most what the failed run had delivered (one run's batch;
  `read_mode: max_records` caps it). Under `delivery: exactly_once` (replication) a failed
  transaction is aborted and nothing is duplicated for `read_committed` readers.
- **No run waits forever.** A broker that stops answering ends the run within
  `delivery.flush_timeout_s` plus a margin, naming the cause (2, 2b); a Spark job past its bound is
  cancelled and named.
- **Recovery needs no hand work** except where the source itself changed in a way only a person
  can judge (a topic recreated, records removed by retention): the run then refuses to guess and
  names the command (`dpone state reset`) or the setting (`on_retention_gap: warn`).
"""


def run_suite(report: Path) -> int:
    env = {**os.environ, "DPONE_FAULT_REPORT": str(report)}
    command = [sys.executable, "-m", "pytest", "-m", "faults", "-q", "-p", "no:cacheprovider", "tests/test_faults.py", "tests/test_state_faults.py", "tests/test_direct_faults.py", "tests/test_sql_direct.py"]
    return subprocess.call(command, cwd=REPO, env=env)


def fault_order(row: dict) -> tuple[int, str]:
    """'1a. ...' before '2. ...' before '10. ...'."""
    number = row["fault"].split(".")[0]
    digits = "".join(ch for ch in number if ch.isdigit())
    return int(digits or 0), row["fault"]


def render(rows: list[dict], exit_code: int) -> str:
    lines = [HEADER, f"Last run: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}, suite exit code {exit_code} ({len(rows)} faults measured).\n"]
    lines.append("| Fault | What the system does | Lost | Duplicated | Recovered | Measured |")
    lines.append("|---|---|---:|---:|---|---|")
    for row in sorted(rows, key=fault_order):
        lines.append(
            f"| {row['fault']} | {row['behaviour']} | {row['lost']:,} | {row['duplicated']:,} | "
            f"{'yes' if row['recovered'] else 'NO'} | {row['measured']} |"
        )
    lines.append(FOOTER)
    return "\n".join(lines)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "faults.jsonl"
        report.touch()
        exit_code = run_suite(report)
        rows = [json.loads(line) for line in report.read_text().splitlines() if line.strip()]
    OUT.write_text(render(rows, exit_code))
    print(f"wrote {OUT.relative_to(REPO)}: {len(rows)} faults, suite exit code {exit_code}")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
