"""Names of attempt events that writers and plain readers both use, apart from the writers (which import SQLAlchemy)."""

SUPERVISOR_RANK = -1  # attempt_events rows the supervisor wrote, not a training process
# The queue's latest reason for an attempt its executor holds (Slurm PENDING: Resources, Priority, BeginTime...).
QUEUED_EVENT = "executor_queued"
# Where a script's trackway.init(config=...) disagreed with the submitted config (ledger/script_config.py).
CONFLICTS_EVENT = "config_conflicts"
# Where a queued job started, as its executor reported it (resources/placement.py records it).
PLACED_EVENT = "placed"
