"""End-to-end tests whose PostgreSQL variant is a trial (`make trials`), not part of `make test`.

These files drive whole runs (supervisors, scripts, retries, evaluations) through the CLI or the
supervisor once per backend. What differs between the backends there is the ledger's SQL, which
tests/ledger/ holds to one contract on both, and which the suite still crosses on PostgreSQL end to
end where it is PostgreSQL's own (tests/ledger, tests/security, the read paths through libpq in
tests/reports/test_explain_stories.py and tests/test_read_api.py, two supervisors in
tests/supervisor/test_survival.py). Their SQLite variant runs in the suite; the PostgreSQL one, twice
the suite's time for the same supervisor code, runs with the other slow trials.
"""

from __future__ import annotations

import pytest

POSTGRESQL_IN_TRIALS = frozenset({
    "tests/checkpoints/test_disk_full.py",
    "tests/checkpoints/test_fallback_and_refusal.py",
    "tests/cli/test_bad_input.py",
    "tests/cli/test_errors.py",
    "tests/cli/test_retries.py",
    "tests/cli/test_small_fixes.py",
    "tests/cli/test_submit.py",
    "tests/cli/test_terminal_width.py",
    "tests/evals/test_eval_cmd.py",
    "tests/evals/test_eval_identity.py",
    "tests/evals/test_evaluations.py",
    "tests/executors/test_node_samples.py",
    "tests/resources/test_placement.py",
    "tests/sdk/test_run.py",
    "tests/supervisor/test_background.py",
    "tests/supervisor/test_log_metrics.py",
    "tests/supervisor/test_outside_checkpoints.py",
    "tests/supervisor/test_policy_validation.py",
})


class BackendTrials:
    """Marks `slow` the PostgreSQL variant (the `ledger_url` fixture's param) of the tests in POSTGRESQL_IN_TRIALS."""

    def __init__(self, rootdir) -> None:
        self.rootdir = rootdir

    @pytest.hookimpl(tryfirst=True)  # before `-m` deselects by mark
    def pytest_collection_modifyitems(self, items) -> None:
        for item in items:
            callspec = getattr(item, "callspec", None)
            if callspec is None or callspec.params.get("ledger_url") != "postgresql":
                continue
            if item.path.relative_to(self.rootdir).as_posix() in POSTGRESQL_IN_TRIALS:
                item.add_marker(pytest.mark.slow)
