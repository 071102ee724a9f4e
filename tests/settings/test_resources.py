"""trackway.toml's [resources.NAME] and [selection]: read into Resources, or refused naming file, line and field."""

from __future__ import annotations

import textwrap

import pytest

from trackway.errors import InputError
from trackway.settings import load_settings

GOOD = """\
[resources.local-5090]
executor = "local"
gpu = "RTX 5090"
gpu_memory_gb = 32
use_for = ["test", "full"]

[resources.ailab]
executor = "slurm"
gpu = "B200"
gpu_memory_gb = 180
gpus_per_node = 8
cost_per_gpu_hour = 2.5
preemptible = true
grace_seconds = 90
partition = "lab"
account = "ml"
sbatch = ["--constraint=b200"]
setup = "module load cuda\\nsource ~/venv/bin/activate"

[[resources.ailab.qos]]
name = "gpu-short"
max_hours = 24

[[resources.ailab.qos]]
name = "gpu-test"
max_hours = 1

[selection]
full = ["ailab", "local-5090"]
"""


def settings_with(tmp_path, text: str):
    (tmp_path / "trackway.toml").write_text(textwrap.dedent(text))
    return load_settings(home=tmp_path / "home", cwd=tmp_path)


def test_a_declared_cluster_is_read_whole(tmp_path):
    settings = settings_with(tmp_path, GOOD)

    ailab = settings.resources["ailab"]
    assert (ailab.executor, ailab.gpu, ailab.gpu_memory_gb, ailab.total_gpus) == ("slurm", "B200", 180.0, 8)
    assert (ailab.partition, ailab.account, ailab.preemptible, ailab.grace_seconds) == ("lab", "ml", True, 90.0)
    # Tiers are tried from the shortest limit up, whatever order the file lists them in.
    assert [(tier.name, tier.max_hours) for tier in ailab.qos] == [("gpu-test", 1.0), ("gpu-short", 24.0)]
    assert ailab.sbatch == ("--constraint=b200",)
    assert ailab.setup == "module load cuda\nsource ~/venv/bin/activate"
    assert settings.resources["local-5090"].use_for == ("test", "full")
    assert settings.selection == {"full": ("ailab", "local-5090")}


@pytest.mark.parametrize("edit, message", [
    (("gpu_memory_gb = 180", 'gpu_memory_gb = "180GB"'),
     r"trackway.toml:10: \[resources.ailab\] gpu_memory_gb: expected a number of GB above 0 and at most 10000, got '180GB'$"),
    (('executor = "slurm"', 'executor = "nomad"'),
     r"trackway.toml:8: \[resources.ailab\] executor: expected 'local' or 'slurm' or 'ssh' or 'kubernetes', got 'nomad'$"),
    (("max_hours = 1\n", "max_hours = 0\n"),
     r"trackway.toml:26: \[\[resources.ailab.qos\]\] #2 max_hours: expected a number of hours above 0"),
    (('use_for = ["test", "full"]', 'use_for = ["training"]'),
     r"trackway.toml:5: \[resources.local-5090\] use_for: expected run kinds among test, full, eval, got 'training'$"),
    (('sbatch = ["--constraint=b200"]', 'sbatch = ["--time=10"]'),
     r"trackway.toml:17: \[resources.ailab\] sbatch: --time is set by trackway \(or by its own field\)$"),
    (('full = ["ailab", "local-5090"]', 'full = ["ailab", "della"]'),
     r"trackway.toml:29: \[selection\] full: 'della' is not a declared resource \(declared: ailab, local-5090\)$"),
    (("gpus_per_node = 8", "gpus_per_node = 8\ngpus = 8"),
     r"trackway.toml:12: \[resources.ailab\] gpus: not a resource field \(known: "),
    (('use_for = ["test", "full"]', 'use_for = ["test", "full"]\npartition = "x"'),
     r"trackway.toml:6: \[resources.local-5090\] partition: a Slurm setting, but executor is 'local'$"),
])
def test_a_bad_entry_names_the_file_the_line_the_field_and_what_was_expected(tmp_path, edit, message):
    old, new = edit
    assert old in GOOD
    with pytest.raises(InputError, match=message) as caught:
        settings_with(tmp_path, GOOD.replace(old, new, 1))
    assert str(caught.value).startswith(str(tmp_path / "trackway.toml"))
    assert "\n" not in str(caught.value)


def test_a_bad_trackway_toml_exits_2_with_one_line_and_no_traceback(tmp_path, cli_process, monkeypatch):
    (tmp_path / "trackway.toml").write_text(GOOD.replace("grace_seconds = 90", "grace_seconds = -1"))
    monkeypatch.chdir(tmp_path)

    result = cli_process("resources")

    assert result.code == 2
    assert result.err.strip().splitlines() == [
        f"trackway: error: {tmp_path / 'trackway.toml'}:14: [resources.ailab] grace_seconds: "
        "expected a number of seconds from 0 to 86400, got -1"
    ]


KUBE = """\
[resources.k8s]
executor = "kubernetes"
namespace = "ml-team"
image = "registry.example.com/train@sha256:0123"
gpus_per_node = 8
node_selector = { "cloud.google.com/gke-nodepool" = "h100-pool" }
priority_class = "training"
service_account = "trainer"
context = "prod"
cpu = "32"
memory = "256Gi"
pvc = "team-checkpoints"
keep_pods = true

[[resources.k8s.tolerations]]
key = "nvidia.com/gpu"
operator = "Exists"
effect = "NoSchedule"
"""


def test_a_kubernetes_resource_is_read_whole(tmp_path):
    k8s = settings_with(tmp_path, KUBE).resources["k8s"]
    assert (k8s.executor, k8s.namespace, k8s.gpu_resource, k8s.pvc, k8s.pvc_mount, k8s.keep_pods) == (
        "kubernetes", "ml-team", "nvidia.com/gpu", "team-checkpoints", "/checkpoints", True)
    assert k8s.node_selector == (("cloud.google.com/gke-nodepool", "h100-pool"),)
    assert k8s.tolerations == ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},)
    assert (k8s.cpu, k8s.memory, k8s.context, k8s.pending_seconds) == ("32", "256Gi", "prod", 600.0)


@pytest.mark.parametrize("edit, message", [
    (('namespace = "ml-team"', 'namespace = "ML_team"'),
     r"trackway.toml:3: \[resources.k8s\] namespace: expected a DNS-1123 label .*, got 'ML_team'$"),
    (('keep_pods = true', 'gpu_resource = "gpu"'),
     r"trackway.toml:13: \[resources.k8s\] gpu_resource: expected an extended resource such as nvidia.com/gpu .*"
     r"got 'gpu'$"),
    (('memory = "256Gi"', 'memory = "lots"'),
     r"\[resources.k8s\] memory: expected a Kubernetes quantity such as 16, 500m or 64Gi, got 'lots'$"),
    (('image = "registry.example.com/train@sha256:0123"\n', ''),
     r"\[resources.k8s\]: executor 'kubernetes' needs image = "),
    (('operator = "Exists"', 'operator = "Maybe"'),
     r"\[\[resources.k8s.tolerations\]\] #1 operator: expected 'Exists' or 'Equal'"),
])
def test_a_bad_kubernetes_entry_is_refused_in_one_line(tmp_path, edit, message):
    with pytest.raises(InputError, match=message) as caught:
        settings_with(tmp_path, KUBE.replace(*edit))
    assert "\n" not in str(caught.value) and str(tmp_path / "trackway.toml") in str(caught.value)


def test_a_kubernetes_setting_on_another_executor_is_refused(tmp_path):
    with pytest.raises(InputError, match=r"\[resources.box\] namespace: a Kubernetes setting, but executor is 'local'"):
        settings_with(tmp_path, '[resources.box]\nexecutor = "local"\nnamespace = "x"\n')
