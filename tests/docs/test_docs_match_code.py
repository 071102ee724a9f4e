"""docs/ states what the code does: the tables the code also holds are equal to it, and every citation resolves.

A design page that drifts from the code is a wrong record: a reader trusts the table of default
retries in docs/taxonomy.md, so it is read here and compared with supervisor/policy.py's rules.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trackway.supervisor.policy import DEFAULT_RULES
from trackway.taxonomy import TerminationReason

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _table(page: str, heading: str) -> list[list[str]]:
    """The rows (cells stripped of backquotes) of the table under `## heading` in docs/`page`."""
    section = (DOCS / page).read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]  # past the header and its rule
    return [[cell.strip().strip("`") for cell in row.strip("|").split("|")] for row in rows]


def test_the_taxonomy_page_lists_every_reason_and_no_other():
    listed = [row[0] for row in _table("taxonomy.md", "The taxonomy")]
    assert sorted(listed) == sorted(reason.value for reason in TerminationReason)
    assert len(listed) == len(set(listed))


def test_the_default_policy_page_is_the_policy_the_supervisor_applies():
    documented = {row[0]: row[1:] for row in _table("taxonomy.md", "The default retry policy")}
    assert set(documented) == {reason.value for reason in TerminationReason}
    for reason, rule in DEFAULT_RULES.items():
        action, budget, condition = documented[reason.value]
        assert (action, int(budget)) == (rule.action, rule.budget), reason
        if rule.requires:
            assert condition == rule.requires, reason
        elif rule.backoff_seconds:
            assert condition.startswith(f"backoff {rule.backoff_seconds:g} s"), reason
        else:
            assert condition == "-", reason


def _cited_paths(text: str) -> set[str]:
    return set(re.findall(r"`((?:src|tests|docs|bench|examples)/[\w./-]+\.(?:py|md|toml))`", text))


@pytest.mark.parametrize("page", sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")))
def test_every_file_a_page_cites_exists(page):
    text = (DOCS / page).read_text()
    cited = _cited_paths(text)
    missing = [path for path in cited if not (ROOT / path).exists()]
    assert missing == [], f"docs/{page} cites files that do not exist: {missing}"


def test_the_code_cites_only_design_pages_that_exist():
    cited: dict[str, list[str]] = {}
    for path in [*ROOT.joinpath("src").rglob("*.py"), *ROOT.joinpath("tests").rglob("*.py")]:
        text = path.read_text(errors="replace")
        for name in re.findall(r"\b(DESIGN\.md|(?:docs|shared/notes)/[\w./-]+\.md)", text):
            if not (ROOT / name).exists():
                cited.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert cited == {}, f"code cites design documents that are not in the repository: {cited}"
