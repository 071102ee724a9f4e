"""The newest migration's revision: a ledger at another revision is migrated (through SQLAlchemy) before it is read.

`tests/ledger/test_schema.py` keeps it equal to the newest file in `ledger/migrations/versions/`.
"""

HEAD_REVISION = "0028"
