"""`trackway resources` counts trackway's own jobs on local and SSH resources: its attempts running there, its runs waiting.

Real parts: the CLI in this process on a SQLite ledger, real local processes, an sshd on loopback (tests/ssh_hosts.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

from waiting import wait_for

PY = sys.executable
SLEEP = "import time; time.sleep(60)"


def _counts(cli) -> dict[str, tuple]:
    return {row["resource"]: (row["running_jobs"], row["pending_jobs"]) for row in cli("resources", "--json").json()}


def test_local_and_ssh_resources_count_the_ledgers_running_and_waiting_runs(cli_sqlite, loopback_host):
    Path("trackway.toml").write_text(
        '[resources.desk]\nexecutor = "local"\n'
        f'[resources.box]\nexecutor = "ssh"\nhosts = ["{loopback_host.spec}"]\nkey_file = "{loopback_host.key}"\n'
        f'workdir = "{loopback_host.work}"\npython = "{PY}"\ngpus_per_node = 2\n'
        'ssh_options = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]\n')
    assert _counts(cli_sqlite) == {"desk": (0, 0), "box": (0, 0)}

    for name, resource in (("here", "desk"), ("there", "box")):
        assert cli_sqlite("submit", "--detach", "--name", name, "--resource", resource, "--", PY, "-c", SLEEP).code == 0
    assert _counts(cli_sqlite) == {"desk": (1, 0), "box": (1, 0)}

    # A host that does not answer: the launch fails, and the run waits for its retry in the ledger's queue.
    loopback_host.stop_sshd()
    assert cli_sqlite("submit", "--detach", "--name", "waits", "--resource", "box", "--", PY, "-c", SLEEP).code == 0
    assert cli_sqlite("show", "waits", "--json").json()["state"] == "queued"
    rows = {row["resource"]: row for row in cli_sqlite("resources", "--json").json()}
    assert rows["box"]["reachable"] is False and (rows["box"]["running_jobs"], rows["box"]["pending_jobs"]) == (1, 1)

    loopback_host.start()
    for name in ("here", "there", "waits"):
        assert cli_sqlite("cancel", name).code == 0
    wait_for(lambda: {cli_sqlite("show", name, "--json").json()["state"] for name in ("here", "there", "waits")}
             == {"cancelled"}, "the cancels to be recorded", interval=0.5)
    assert _counts(cli_sqlite) == {"desk": (0, 0), "box": (0, 0)}


def test_a_local_resources_running_count_on_every_ledger_backend(cli):
    Path("trackway.toml").write_text('[resources.desk]\nexecutor = "local"\n')
    assert _counts(cli) == {"desk": (0, 0)}
    assert cli("submit", "--detach", "--name", "here", "--", PY, "-c", SLEEP).code == 0
    assert _counts(cli) == {"desk": (1, 0)}
    shown = cli("resources")
    assert shown.code == 0 and "1/0" in shown.out  # the run/pend column, no longer "-"
    assert cli("cancel", "here").code == 0
    wait_for(lambda: cli("show", "here", "--json").json()["state"] == "cancelled", "the cancel to be recorded",
             interval=0.5)
    assert _counts(cli) == {"desk": (0, 0)}
