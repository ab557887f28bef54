"""Check what the demo made, so a demo that ran but did nothing useful fails and names the step.

Usage: python examples/check_demo.py OUT_DIR [zoo-test | zoo-holdout | zoo | dyepack | star ...]
(no part: every part). Exit 0 and one line per part when all is as expected; exit 1 and one line,
``demo check failed: <script> step N (<what>): <why>``, at the first thing that is not.

Why: a worker that could not sandbox once failed every baseline job and `make demo` still exited 0, with
empty standings (issue 36). Each demo script calls this on its own part as soon as that part is done; the
Makefile's `demo` target checks everything again at the end. The checker reads only files the demo wrote,
the CLI's ``--json`` outputs (zoo) and the reports' ``summary.json`` (DyePack, STAR), so a test can hand it
fabricated folders instead of running the demo.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

BASELINES = ("constant", "meta_classifier", "neural_cleanse")  # examples/zoo-demo.sh submits these
ZOO_TEST = "zoo-demo step 3 (baselines on the test split)"
ZOO_HOLDOUT = "zoo-demo step 4 (holdout after closing the round)"
DYEPACK_CLEAN = "dyepack-demo step 2 (verify the clean model)"
DYEPACK_DIRTY = "dyepack-demo step 3 (verify the contaminated model)"
STAR_REPORT = "star-demo step 3 (report)"


class Failed(Exception):
    """A step of the demo did not do what it should; the message names the step and says why."""

    def __init__(self, step: str, why: str) -> None:
        super().__init__(f"{step}: {why}")


def _json(path: Path, step: str) -> Any:
    """A JSON file the demo wrote; missing or unreadable is the step's failure."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise Failed(step, f"{path} is missing (the step did not finish)") from None
    except (OSError, ValueError) as err:
        raise Failed(step, f"{path} is not readable JSON ({err})") from None


def _last_error(log: str) -> str:
    """The line of a job's harness log that says what went wrong (else its last line), cut short."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    found = next((line for line in reversed(lines) if "error" in line.lower()), lines[-1] if lines else "")
    return found[:300] or "no log"


def _standings(path: Path, step: str) -> list[dict[str, Any]]:
    rows = _json(path, step)
    if not isinstance(rows, list) or not rows:
        raise Failed(step, f"the standings are empty ({path})")
    return rows


def check_zoo_test(out: Path) -> str:
    """Every baseline's test job is done (its cause if not), and the test standings rank all of them."""
    folder = out / "zoo" / "check"
    for detector in BASELINES:
        record = _json(folder / f"results-{detector}.json", ZOO_TEST)
        status = (record.get("job") or {}).get("status", "no job")
        if status != "done":
            why = _last_error(record.get("log") or "")
            raise Failed(ZOO_TEST, f"team-{detector}'s job is {status}, not done: {why}")
    rows = _standings(folder / "standings-test.json", ZOO_TEST)
    missing = sorted({f"team-{d}" for d in BASELINES} - {r.get("team") for r in rows})
    if missing:
        raise Failed(ZOO_TEST, f"no standing for {', '.join(missing)}")
    return f"zoo test: {len(BASELINES)} baseline jobs done, {len(rows)} teams ranked"


def check_zoo_holdout(out: Path) -> str:
    """Every job of the round (test and holdout) is done, and the holdout standings rank every baseline."""
    folder = out / "zoo" / "check"
    jobs = _json(folder / "status.json", ZOO_HOLDOUT).get("jobs", {})
    other = {status: n for status, n in jobs.items() if status != "done" and n}
    if other or not jobs:
        counts = ", ".join(f"{n} {status}" for status, n in sorted(jobs.items())) or "none"
        raise Failed(ZOO_HOLDOUT, f"jobs not all done ({counts}); see assay leaderboard status")
    rows = _standings(folder / "standings-holdout.json", ZOO_HOLDOUT)
    if len(rows) != len(BASELINES):
        raise Failed(ZOO_HOLDOUT, f"{len(rows)} of {len(BASELINES)} baselines ranked on holdout")
    return f"zoo holdout: {sum(jobs.values())} jobs done, {len(rows)} teams ranked"


def _verdict(path: Path, step: str, flagged: bool) -> str:
    summary = _json(path, step)
    if summary.get("flagged") is not flagged:
        want = "CONTAMINATED" if flagged else "not flagged"
        raise Failed(step, f"expected {want}, got: {summary.get('verdict', 'no verdict')}")
    return f"{summary.get('activated')}/{summary.get('backdoors')} activated"


def check_dyepack(out: Path) -> str:
    """The model that never saw the release is not flagged; the one fine-tuned on it is."""
    folder = out / "dyepack"
    clean = _verdict(folder / "verify-clean" / "summary.json", DYEPACK_CLEAN, flagged=False)
    dirty = _verdict(folder / "verify-contaminated" / "summary.json", DYEPACK_DIRTY, flagged=True)
    return f"dyepack: clean model not flagged ({clean}), contaminated model flagged ({dirty})"


def check_star(out: Path) -> str:
    """The report page is there and its summary counts the rehearsed dialogues."""
    folder = out / "star" / "report"
    page = folder / "report.html"
    if not page.is_file() or page.stat().st_size == 0:
        raise Failed(STAR_REPORT, f"{page} is missing or empty")
    dialogues = (_json(folder / "summary.json", STAR_REPORT).get("n") or {}).get("dialogues") or 0
    if dialogues < 1:
        raise Failed(STAR_REPORT, "the report counts no dialogues")
    return f"star: report with {dialogues} dialogues"


CHECKS: dict[str, tuple[Callable[[Path], str], ...]] = {
    "zoo-test": (check_zoo_test,),
    "zoo-holdout": (check_zoo_holdout,),
    "zoo": (check_zoo_test, check_zoo_holdout),
    "dyepack": (check_dyepack,),
    "star": (check_star,),
}
EVERYTHING = ("zoo", "dyepack", "star")


def main(argv: list[str]) -> int:
    """Run the named checks on OUT_DIR; 0 when all pass, 1 at the first failure, 2 on bad arguments."""
    if not argv or any(part not in CHECKS for part in argv[1:]):
        print(f"usage: check_demo.py OUT_DIR [{' | '.join(CHECKS)} ...]", file=sys.stderr)
        return 2
    out = Path(argv[0])
    try:
        for part in argv[1:] or EVERYTHING:
            for check in CHECKS[part]:
                print(f"demo check: {check(out)}")
    except Failed as failed:
        print(f"demo check failed: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
