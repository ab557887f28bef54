"""The contamination board as files to publish: a self-contained HTML page, a CSV of cells and the JSON.

Everything comes from a ``board.Board``, which holds only key-free results, so an export can be put on any
public page. The HTML has no script and no external link (its style is inline), so it opens from disk.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from assay.dyepack.board import Board, Cell
from assay.fileio import write_text_atomic

TEMPLATE = Path(__file__).parent / "templates" / "board.html"
CSV_COLUMNS = (
    "model",
    "spec",
    "kind",
    "release",
    "commitment",
    "state",
    "verdict",
    "activated",
    "backdoors",
    "fpr",
    "log10_fpr",
    "alpha",
    "format",
    "run_id",
    "finished_at",
)
FILES = ("board.html", "board.csv", "board.json")


def verdict(cell: Cell) -> str:
    """The cell's word for people: contaminated, not flagged, or its state (pending, running, failed)."""
    if cell.state != "done":
        return cell.state
    return "contaminated" if cell.flagged else "not flagged"


def to_csv(board: Board) -> str:
    """One row per cell, models in board order, then releases."""
    out = io.StringIO()
    writer = csv.DictWriter(out, CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for model, row in zip(board.models, board.cells, strict=True):
        for release, cell in zip(board.releases, row, strict=True):
            writer.writerow(
                {
                    "model": model.name,
                    "spec": model.spec,
                    "kind": model.kind,
                    "release": release.name,
                    "commitment": release.commitment,
                    "state": cell.state,
                    "verdict": verdict(cell),
                    "activated": cell.activated,
                    "backdoors": cell.backdoors,
                    "fpr": "" if cell.fpr is None else repr(cell.fpr),
                    "log10_fpr": "" if cell.log10_fpr is None else repr(cell.log10_fpr),
                    "alpha": cell.alpha,
                    "format": cell.format,
                    "run_id": cell.run_id,
                    "finished_at": cell.finished_at.isoformat() if cell.finished_at else "",
                }
            )
    return out.getvalue()


def to_json(board: Board) -> str:
    return board.model_dump_json(indent=2) + "\n"


def to_html(board: Board) -> str:
    """The self-contained page (autoescaped Jinja2)."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

    env = Environment(
        loader=FileSystemLoader(TEMPLATE.parent),
        autoescape=select_autoescape(["html"]),
        undefined=StrictUndefined,
    )
    return env.get_template(TEMPLATE.name).render(
        board=board, verdict=verdict, rows=zip(board.models, board.cells, strict=True)
    )


def write_export(board: Board, out: Path) -> list[Path]:
    """``board.html``, ``board.csv`` and ``board.json`` in ``out``, each written atomically (other files in
    ``out`` are left alone); all three are rendered before the first is written."""
    texts = dict(zip(FILES, (to_html(board), to_csv(board), to_json(board)), strict=True))
    paths = []
    for name, text in texts.items():
        write_text_atomic(out / name, text)
        paths.append(out / name)
    return paths
