"""docs/deploy.md cannot drift from what ``make test-deploy`` runs: every ``bash`` block there is either one
the deploy tests run as written (it holds exactly one of ``platform_image.RUN_MARKERS``, and each marker
names exactly one block) or says, in a comment above it, why it is not run. Cheap, so ``make test`` checks
it on every run; the deploy tests then run the blocks themselves."""

from __future__ import annotations

from pathlib import Path

from platform_image import RUN_MARKERS, SKIP_COMMENT, docs_blocks


def test_every_documented_block_runs_or_says_why() -> None:
    blocks = docs_blocks()
    assert len(blocks) >= len(RUN_MARKERS)
    for block in blocks:
        held = [marker for marker in RUN_MARKERS if marker in block.text]
        if block.not_run:
            assert not held, f"{block.section}: a block marked not run holds {held}:\n{block.text}"
        else:
            assert len(held) == 1, f"{block.section}: run by no deploy test and not marked:\n{block.text}"
    run = [b for b in blocks if not b.not_run]
    for marker in RUN_MARKERS:
        assert sum(marker in b.text for b in run) == 1, marker


def test_blocks_are_read_as_a_reader_copies_them(tmp_path: Path) -> None:
    """Indented blocks (inside a list) lose their indent; the comment above a block marks it, no other."""
    page = tmp_path / "page.md"
    page.write_text(
        "## One\n\n<!-- not run by make test-deploy: a placeholder -->\n```bash\necho a\n```\n\n"
        "- item\n\n  ```bash\n  echo b \\\n      c\n  ```\n"
    )
    first, second = docs_blocks(page)
    assert (first.text, first.section, first.not_run) == ("echo a\n", "One", "a placeholder")
    assert (second.text, second.not_run) == ("echo b \\\n    c\n", "")
    assert SKIP_COMMENT.search("<!-- not run by make test-deploy: why -->")
