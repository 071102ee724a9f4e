"""The performance table (README.md, docs/guide/performance.md) is what bench/results.json (written by `make bench`) makes of it, never pasted.

`bench/run_all.py` writes bench/results.json and then scripts/gen_performance.py rewrites the table;
a figure edited by hand in either page, or results committed without the table written again, fail here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "scripts" / "gen_performance.py"


def _cell(text: str) -> str:
    """A figure's name as a Markdown table cell spells it (escaped by hand here, not by the generator under test)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")


def test_the_readme_table_is_what_the_committed_results_make_of_it():
    done = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("page", ["README.md", "docs/guide/performance.md"])
def test_every_figure_in_the_results_is_a_row_naming_its_command(page):
    results = json.loads((ROOT / "bench" / "results.json").read_text(encoding="utf-8"))
    readme = (ROOT / page).read_text(encoding="utf-8")
    table = readme[readme.index("<!-- performance:begin -->"):readme.index("<!-- performance:end -->")]
    assert results["rows"], "bench/results.json holds no figure"
    for row in results["rows"]:
        assert (ROOT / "bench" / row["bench"]).exists(), f"{row['bench']}: no such bench"
        line = next((line for line in table.splitlines() if line.startswith(f"| {_cell(row['figure'])} |")), None)
        assert line is not None, f"{row['figure']}: not in {page}'s table"
        assert f"`python bench/{row['bench']}`" in line
        if row["met"] is False:
            assert "**missed**" in line
