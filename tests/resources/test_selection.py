"""Selection on a table of cases: what a run needs, what each resource has now, and the reasons recorded."""

from __future__ import annotations

import json

import pytest

from trackway.errors import InputError
from trackway.resources.availability import Availability
from trackway.settings.resources import QosTier, Resource
from trackway.resources.selection import Need, NoResourceFits, Selection, select

TIERS = (QosTier("gpu-test", 1), QosTier("gpu-short", 24), QosTier("gpu-medium", 72))
LOCAL_5090 = Resource("local-5090", "local", gpu="RTX 5090", gpu_memory_gb=32, gpus_per_node=1, use_for=("test", "full"))
AILAB = Resource("ailab", "slurm", gpu="B200", gpu_memory_gb=180, gpus_per_node=8, cost_per_gpu_hour=2.5,
                 partition="lab", qos=TIERS)
DELLA = Resource("della-h100", "slurm", gpu="H100", gpu_memory_gb=80, gpus_per_node=4, nodes=4, cost_per_gpu_hour=1.8,
                 partition="gpu", qos=TIERS)
A6000 = Resource("a6000-box", "local", gpu="RTX A6000", gpu_memory_gb=48, gpus_per_node=2, use_for=("eval",))
ALL = [LOCAL_5090, AILAB, DELLA, A6000]
PRIORITY = {"full": ("ailab", "della-h100", "local-5090"), "test": ("local-5090", "ailab"), "eval": ("a6000-box",)}


def up(name: str, free: int, total: int, running: int | None = None, pending: int | None = None) -> Availability:
    return Availability(name, True, free_gpus=free, total_gpus=total, running_jobs=running, pending_jobs=pending)


def down(name: str) -> Availability:
    return Availability(name, False, error="sinfo did not answer within 5 s")


BUSY_DAY = {
    "local-5090": up("local-5090", 1, 1),
    "ailab": up("ailab", 2, 8, running=3, pending=0),
    "della-h100": up("della-h100", 0, 16, running=16, pending=41),
    "a6000-box": up("a6000-box", 2, 2),
}


CASES = [
    # (case, need, availability, chosen, qos, words the reasons must hold)
    ("the issue's example", Need("full", gpus=2, gpu_memory_min_gb=80, time_limit_hours=20), BUSY_DAY,
     "ailab", "gpu-short",
     ["chose ailab/gpu-short: 2 of 8 B200 free, the 24 h tier covers 20 h",
      "skipped local-5090: 32 GB < 80 GB asked", "skipped della-h100: 0 of 16 GPUs free, 41 jobs pending",
      "skipped a6000-box: not used for full runs"]),
    ("a quick test goes to the workstation first", Need("test", gpus=1, time_limit_hours=0.5), BUSY_DAY,
     "local-5090", None, ["1st in [selection] test", "skipped ailab: 2nd in [selection] test, after local-5090"]),
    ("the shortest tier that covers the limit", Need("full", gpus=1, time_limit_hours=1), BUSY_DAY,
     "ailab", "gpu-test", ["the 1 h tier covers 1 h"]),
    ("no time limit: the longest tier", Need("full", gpus=1), BUSY_DAY,
     "ailab", "gpu-medium", ["no time limit asked: the longest tier (72 h)"]),
    ("longer than every tier: only the local machine", Need("full", gpus=1, time_limit_hours=100), BUSY_DAY,
     "local-5090", None, ["skipped ailab: 100 h asked, its longest QoS (gpu-medium) allows 72 h"]),
    ("more GPUs than a box has, over nodes", Need("full", gpus=12, nodes=3), BUSY_DAY,
     "della-h100", "gpu-medium", ["skipped ailab: 3 nodes asked, it declares nodes = 1", "waits in its queue"]),
    ("free GPUs now outrank the priority list", Need("full", gpus=2),
     {**BUSY_DAY, "ailab": up("ailab", 0, 8, running=8, pending=5), "della-h100": up("della-h100", 4, 16)},
     "della-h100", "gpu-medium", ["4 of 16 H100 free", "skipped ailab: 0 of 8 GPUs free, 5 jobs pending"]),
    ("an unreachable cluster is passed over", Need("full", gpus=1), {**BUSY_DAY, "ailab": down("ailab")},
     "local-5090", None, ["skipped ailab: unreachable (sinfo did not answer within 5 s)",
                          "skipped della-h100: 0 of 16 GPUs free, 41 jobs pending"]),
    ("cost breaks a tie the priority list leaves", Need("full", gpus=1),
     BUSY_DAY | {"della-h100": up("della-h100", 4, 16)}, "ailab", "gpu-medium", ["$2.50/GPU-h"]),
    ("evaluations go to the inference box", Need("eval", gpus=1), BUSY_DAY,
     "a6000-box", None, ["1st in [selection] eval", "skipped local-5090: not used for eval runs (use_for: test, full)"]),
    ("everyone busy: the first by priority, queued", Need("full", gpus=4, time_limit_hours=30),
     {name: up(name, 0, row.total_gpus or 0, running=1, pending=9) for name, row in BUSY_DAY.items()},
     "ailab", "gpu-medium", ["0 of 8 B200 free, so the run waits in its queue, 9 jobs pending"]),
]


@pytest.mark.parametrize("case, need, available, chosen, qos, words", CASES, ids=[c[0] for c in CASES])
def test_selection_chooses_and_says_why(case, need, available, chosen, qos, words):
    selection = select(need, ALL, available, PRIORITY.get(need.kind, ()))

    assert (selection.resource, selection.qos) == (chosen, qos)
    text = selection.text()
    for word in words:
        assert word in text
    # Every resource is either chosen or passed over with a reason: nothing silently dropped.
    assert sorted([selection.resource, *(name for name, _ in selection.skipped)]) == sorted(r.name for r in ALL)


def test_cost_ranks_resources_the_priority_list_does_not_name():
    cheap = Resource("cheap", "local", gpus_per_node=1, cost_per_gpu_hour=0.5)
    dear = Resource("dear", "local", gpus_per_node=1, cost_per_gpu_hour=3.0)
    found = {"cheap": up("cheap", 1, 1), "dear": up("dear", 1, 1)}

    selection = select(Need("full", gpus=1), [dear, cheap], found)

    assert selection.resource == "cheap"
    assert selection.skipped == (("dear", "$3.00/GPU-h against $0.50 for cheap"),)


def test_when_nothing_fits_the_error_names_every_resource_and_why():
    with pytest.raises(NoResourceFits) as caught:
        select(Need("full", gpus=2, gpu_memory_min_gb=200), ALL, BUSY_DAY, PRIORITY["full"])

    message = str(caught.value)
    assert message.startswith("no resource can take this run: ")
    for part in ("local-5090: 32 GB < 200 GB asked", "ailab: 180 GB < 200 GB asked", "della-h100: 80 GB < 200 GB asked",
                 "a6000-box: not used for full runs"):
        assert part in message
    assert "\n" not in message


def test_a_resource_asked_for_by_name_is_checked_but_not_ranked():
    selection = select(Need("full", gpus=2, time_limit_hours=30), ALL, {}, requested="della-h100")
    assert (selection.resource, selection.qos, selection.skipped) == ("della-h100", "gpu-medium", ())

    with pytest.raises(InputError, match=r"^--resource 'local-5090': local-5090: 2 GPU\(s\) asked, it has 1$"):
        select(Need("full", gpus=2), ALL, {}, requested="local-5090")
    with pytest.raises(InputError, match=r"^--resource 'nope': not declared in trackway.toml"):
        select(Need("full"), ALL, {}, requested="nope")


def test_unknown_memory_is_not_taken_for_enough():
    unknown = Resource("mystery", "slurm", gpus_per_node=4)
    with pytest.raises(NoResourceFits, match="its GPU memory is unknown \\(declare gpu_memory_gb\\)"):
        select(Need("full", gpus=1, gpu_memory_min_gb=40), [unknown], {"mystery": up("mystery", 4, 4)})


def test_a_selection_survives_the_ledger_round_trip():
    selection = select(Need("full", gpus=2, gpu_memory_min_gb=80, time_limit_hours=20), ALL, BUSY_DAY, PRIORITY["full"])

    stored = selection.to_json()

    assert json.loads(stored)["chosen"] == "ailab"
    assert Selection.from_json(stored) == selection


def lab(free: int = 2, max_time_hours: float | None = 24, max_nodes: int | None = 1) -> Availability:
    """A Slurm partition as `scontrol show partition` says it: MaxTime and MaxNodes (at most its nodes)."""
    return Availability("ailab", True, free_gpus=free, total_gpus=8, partition="lab", max_time_hours=max_time_hours,
                        max_time_text=f"{max_time_hours:g}:00:00" if max_time_hours else None, max_nodes=max_nodes)


def test_a_partitions_max_time_bounds_every_tier_and_is_named_when_it_refuses():
    # The 72 h tier is declared, but partition lab runs nothing past 24 h: a 48 h run can never start there.
    with pytest.raises(NoResourceFits) as refused:
        select(Need("full", gpus=1, time_limit_hours=48), [AILAB], {"ailab": lab()})
    assert str(refused.value) == ("no resource can take this run: ailab: 48 h asked, partition lab allows 24 h "
                                  "(MaxTime 24:00:00); --in-pieces runs it in pieces")
    chosen = select(Need("full", gpus=1, time_limit_hours=20), [AILAB], {"ailab": lab()})
    assert (chosen.resource, chosen.qos, chosen.piece_hours) == ("ailab", "gpu-short", None)


def test_a_partitions_max_nodes_refuses_a_run_over_more_nodes():
    with pytest.raises(NoResourceFits) as refused:
        select(Need("full", gpus=8, nodes=2), [DELLA], {"della-h100": Availability(
            "della-h100", True, free_gpus=16, total_gpus=16, partition="gpu", max_nodes=1)})
    assert "della-h100: 2 nodes asked, partition gpu allows 1 per job (MaxNodes" in str(refused.value)


def test_a_run_in_pieces_takes_the_longest_tier_within_the_partition_and_plans_its_pieces():
    need = Need("full", gpus=1, time_limit_hours=100, in_pieces=True)
    chosen = select(need, [AILAB], {"ailab": lab()})
    assert (chosen.qos, chosen.piece_hours) == ("gpu-medium", 24)  # the 72 h tier, cut to the partition's 24 h
    assert "in pieces (--in-pieces): 100 h as 5 attempts of at most 24 h" in chosen.text()
    assert Selection.from_json(chosen.to_json()) == chosen  # the attempt's receipt keeps the plan
    # Without a partition limit known, the longest tier is the piece; one that fits whole is no piece at all.
    assert select(need, [AILAB], {"ailab": lab(max_time_hours=None)}).piece_hours == 72
    whole = select(Need("full", gpus=1, time_limit_hours=20, in_pieces=True), [AILAB], {"ailab": lab()})
    assert (whole.qos, whole.piece_hours) == ("gpu-short", None)
