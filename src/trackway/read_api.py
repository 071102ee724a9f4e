"""The public read API: runs, attempts and metric histories from the ledger, as Python values or arrays.

```python
import trackway
api = trackway.Api()                          # the ledger `trackway` itself would use here
for run in api.runs(project="gpt-small"):
    print(run["name"], run["state"], run["attempt_count"])
loss = api.history("my-run", "loss")          # every point, on the run's step axis across attempts
api.ranks("my-run")                           # the ranks that logged: [0, 1] under torchrun with 2 processes
loss1 = api.history("my-run", "loss", rank=1) # rank 1's own values (rank 0's by default)
loss.steps, loss.values                       # plain lists
loss.to_numpy()["value"], loss.to_pandas()    # when numpy / pandas are installed
```

Reads go through `trackway.ledger.reader`: a SQLite ledger is read over plain `sqlite3`, a
history comes back in chunks of tuples with no dict or object per point, so 100k points cost
little more than the query itself. Nothing here writes to the ledger.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

from trackway.ledger.reader import Reader, open_reader

__all__ = ["Api", "History"]


@dataclass
class History:
    """One metric of one run, point by point, ordered by step (a resumed attempt's points replace redone steps)."""

    run_id: str
    key: str
    rank: int = 0  # the process (torch.distributed rank) that logged it
    steps: list[int] = field(default_factory=list)
    values: list[float | None] = field(default_factory=list)
    attempt_numbers: list[int] = field(default_factory=list)  # which attempt wrote each point
    logged_at: list[float] = field(default_factory=list)  # unix seconds

    def __len__(self) -> int:
        return len(self.steps)

    def to_numpy(self) -> dict[str, Any]:
        """The columns as numpy arrays (`step`, `value` with NaN for a missing value, `attempt`, `logged_at`)."""
        import numpy as np

        return {
            "step": np.array(self.steps, dtype=np.int64),
            "value": np.array(self.values, dtype=np.float64),  # None becomes NaN
            "attempt": np.array(self.attempt_numbers, dtype=np.int32),
            "logged_at": np.array(self.logged_at, dtype=np.float64),
        }

    def to_pandas(self):
        """A DataFrame indexed by step, with the metric's values under its key and the attempt that wrote each."""
        import pandas as pd

        columns = self.to_numpy()
        return pd.DataFrame({self.key: columns["value"], "attempt": columns["attempt"],
                             "logged_at": columns["logged_at"]}, index=pd.Index(columns["step"], name="step"))


class Api:
    """Read access to one ledger: `db` is a ledger URL, else it is found as the CLI finds it.

    `home` and `db` mean what `trackway --home/--db` mean: $TRACKWAY_DB, then `trackway.toml`,
    then `$TRACKWAY_HOME/ledger.db` (default `./.trackway`).
    """

    def __init__(self, db: str | None = None, home: str | Path | None = None):
        from trackway.settings import load_settings

        self.db_url = load_settings(home=str(home) if home is not None else None, db=db).db_url

    @contextmanager
    def _reader(self) -> Iterator[Reader]:
        with open_reader(self.db_url) as reader:
            yield reader

    def runs(self, project: str | None = None, kind: str | Sequence[str] | None = None,
             limit: int | None = 50) -> list[dict[str, Any]]:
        """Runs newest first, each with `attempt_count`; `kind` one of test/full/eval or a list (default all)."""
        kinds = [kind] if isinstance(kind, str) else list(kind) if kind else None
        with self._reader() as reader:
            return reader.runs(limit=limit, project=project, kinds=kinds)

    def run(self, ref: str) -> dict[str, Any]:
        """One run by id or name (NotFound when there is none)."""
        with self._reader() as reader:
            return reader.run(ref)

    def attempts(self, run: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """A run's attempts (its receipts) by number, or every run's newest first."""
        with self._reader() as reader:
            run_id = reader.run(run)["run_id"] if run else None
            return reader.attempts(run_id=run_id, limit=limit)

    def metric_keys(self, run: str, rank: int = 0) -> list[str]:
        """The keys `rank` (default 0) logged for `run`."""
        with self._reader() as reader:
            run_id = reader.run(run)["run_id"]
            return reader.metric_keys(run_id, reader.check_rank(run_id, rank))

    def ranks(self, run: str) -> list[int]:
        """The ranks that logged metrics for `run`, lowest first: [0] for one process, [] before any metric."""
        with self._reader() as reader:
            return reader.metric_ranks(reader.run(run)["run_id"])

    def history(self, run: str, key: str, rank: int = 0) -> History:
        """Every point of `key` that `rank` (default 0) logged for `run` (NotFound, naming what it has, otherwise)."""
        from trackway.errors import NotFound

        with self._reader() as reader:
            run_id = reader.run(run)["run_id"]
            rank = reader.check_rank(run_id, rank)
            history = History(run_id=run_id, key=key, rank=rank)
            columns = (history.steps, history.values, history.attempt_numbers, history.logged_at)
            for chunk in reader.series_chunks(run_id, key, rank):
                # One C loop per column: half the time of zip(*chunk), which builds every column twice.
                for index, column in enumerate(columns):
                    column.extend(map(itemgetter(index), chunk))
            if not history.steps and key not in reader.metric_keys(run_id, rank):
                keys = reader.metric_keys(run_id, rank)
                has = f"it has {', '.join(keys)}" if keys else "it has logged no metrics yet"
                who = f" rank {rank} of" if rank else ""
                raise NotFound(f"metric {key!r}: not logged by{who} run {run}; {has}")
        return history
