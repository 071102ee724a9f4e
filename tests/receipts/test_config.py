"""Config snapshots: the same values hash the same in any format; --set and bad files fail with one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trackway.errors import InputError, NotFound
from trackway.receipts.config import load_config

TOML = """
seed = 7
[optimizer]
name = "adamw"
lr = 3e-4
betas = [0.9, 0.95]
"""

YAML = """
optimizer:
  betas: [0.9, 0.95]
  lr: 3.0e-4
  name: adamw
seed: 7
"""

JSON = '{"optimizer": {"betas": [0.9, 0.95], "name": "adamw", "lr": 0.0003}, "seed": 7}'


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_same_values_in_toml_yaml_and_json_hash_the_same(tmp_path: Path) -> None:
    snapshots = [
        load_config(write(tmp_path, "c.toml", TOML)),
        load_config(write(tmp_path, "c.yaml", YAML)),
        load_config(write(tmp_path, "c.yml", YAML)),
        load_config(write(tmp_path, "c.json", JSON)),
    ]
    assert {s.sha256 for s in snapshots} == {snapshots[0].sha256}
    assert snapshots[0].values == {"seed": 7, "optimizer": {"name": "adamw", "lr": 3e-4, "betas": [0.9, 0.95]}}
    assert snapshots[0].canonical == b'{"optimizer":{"betas":[0.9,0.95],"lr":0.0003,"name":"adamw"},"seed":7}'


def test_a_changed_value_changes_the_hash(tmp_path: Path) -> None:
    base = load_config(write(tmp_path, "a.toml", TOML))
    changed = load_config(write(tmp_path, "b.toml", TOML.replace("seed = 7", "seed = 8")))
    assert base.sha256 != changed.sha256


def test_no_path_and_no_overrides_is_no_snapshot() -> None:
    assert load_config(None) is None
    assert load_config(None, []) is None


def test_set_overrides_nested_keys_with_json_types(tmp_path: Path) -> None:
    snap = load_config(
        write(tmp_path, "c.toml", TOML),
        ["optimizer.lr=1e-3", "optimizer.fused=true", 'name="x"', "layers=[1,2]", "sched.warmup.steps=100",
         "tag=run one", "optimizer.name=null"],
    )
    assert snap.values["optimizer"]["lr"] == 1e-3 and isinstance(snap.values["optimizer"]["lr"], float)
    assert snap.values["optimizer"]["fused"] is True
    assert snap.values["optimizer"]["name"] is None
    assert snap.values["name"] == "x"
    assert snap.values["layers"] == [1, 2]
    assert snap.values["sched"] == {"warmup": {"steps": 100}}
    assert snap.values["tag"] == "run one"
    assert snap.values["optimizer"]["betas"] == [0.9, 0.95]  # untouched siblings survive


def test_set_without_a_file_builds_the_config(tmp_path: Path) -> None:
    snap = load_config(None, ["optimizer.lr=3e-4"])
    assert snap.values == {"optimizer": {"lr": 3e-4}}
    assert snap.sha256 == load_config(write(tmp_path, "c.json", '{"optimizer": {"lr": 0.0003}}')).sha256


def test_set_applies_in_order_so_the_last_wins() -> None:
    assert load_config(None, ["a=1", "a=2"]).values == {"a": 2}


@pytest.mark.parametrize("item", ["lr", "=3", "optimizer..lr=1", ".lr=1", "lr.=1"])
def test_malformed_set_names_the_flag(item: str) -> None:
    with pytest.raises(InputError) as caught:
        load_config(None, [item])
    message = str(caught.value)
    assert message.startswith(f"--set {item!r}:")
    assert "\n" not in message


def test_set_through_a_value_that_is_not_a_table_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(InputError) as caught:
        load_config(write(tmp_path, "c.toml", TOML), ["seed.value=1"])
    assert "'seed'" in str(caught.value) and "--set 'seed.value=1'" in str(caught.value)


def test_set_of_nan_is_refused_because_it_cannot_be_hashed() -> None:
    with pytest.raises(InputError, match="--set 'lr=NaN'"):
        load_config(None, ["lr=NaN"])


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("cfg.toml", "[a]\nb c = 1\n", "--config {path}: not valid TOML:"),
        ("cfg.yaml", "a: [1, 2\nb: 3\n", "--config {path}: not valid YAML:"),
        ("cfg.json", '{"a": 1,}', "--config {path}: not valid JSON:"),
        ("cfg.yaml", "- 1\n- 2\n", "--config {path}: expected a mapping at the top level"),
        ("cfg.json", "[1]", "--config {path}: expected a JSON object at the top level"),
        ("cfg.yaml", "lr: .nan\n", "--config {path}: value at 'lr' is nan"),
        ("cfg.yaml", "1: a\n", "--config {path}: key 1 is not a string"),
    ],
)
def test_unparseable_config_is_one_line_naming_the_file(tmp_path: Path, name: str, text: str, expected: str) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(InputError) as caught:
        load_config(path)
    message = str(caught.value)
    assert message.startswith(expected.format(path=path))
    assert "\n" not in message


def test_toml_error_says_where(tmp_path: Path) -> None:
    path = write(tmp_path, "cfg.toml", "a = 1\nb c = 2\n")
    with pytest.raises(InputError, match=r"line 2"):
        load_config(path)


def test_unknown_extension_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"^--config .*x\.ini: expected a \.toml, \.yaml, \.yml or \.json file$"):
        load_config(write(tmp_path, "x.ini", "[a]\nb=1\n"))
    with pytest.raises(NotFound, match=r"^--config .*nope\.toml: no such file$"):
        load_config(tmp_path / "nope.toml")


def test_dates_are_recorded_as_iso_text(tmp_path: Path) -> None:
    toml = load_config(write(tmp_path, "c.toml", "cutoff = 2024-05-01\n"))
    yaml_ = load_config(write(tmp_path, "c.yaml", "cutoff: 2024-05-01\n"))
    assert toml.values == {"cutoff": "2024-05-01"}
    assert toml.sha256 == yaml_.sha256


def test_empty_yaml_is_an_empty_config(tmp_path: Path) -> None:
    snap = load_config(write(tmp_path, "c.yaml", "# nothing yet\n"))
    assert snap.values == {}
    assert json.loads(snap.canonical) == {}


# --- bounds: what a hostile config gets (issue 31) ---------------------------------------------

_ALIAS_BOMB = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]\n" for previous, name in zip("abcdefgh", "bcdefghi")
)


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("bomb.yaml", _ALIAS_BOMB, "its aliases expand to more than 1,000,000 values"),
    ("cycle.yaml", "a: &a [1, *a]\n", "an alias refers to a value that contains it"),
    ("deep.yaml", "x: " + "[" * 5000 + "]" * 5000 + "\n", "nested more than 64 levels deep"),
    ("deep.json", '{"x": ' + "[" * 5000 + "]" * 5000 + "}", "nested more than 64 levels deep"),
    ("deep.toml", "x = " + "[" * 5000 + "]" * 5000 + "\n", "nested more than 64 levels deep"),
    ("d65.json", '{"x": ' + "[" * 64 + "]" * 64 + "}", "nested more than 64 levels deep at 'x[0]"),
])
def test_hostile_configs_are_refused_by_name_in_one_line(tmp_path: Path, name: str, text: str, expected: str) -> None:
    # Before: the bomb did not finish in 60 s; nesting gave `internal error: RecursionError`.
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InputError) as refused:
        load_config(path)
    message = str(refused.value)
    assert message.startswith(f"--config {path}: ") and expected in message
    assert "\n" not in message and len(message) < 400


def test_a_config_as_deep_as_the_bound_and_aliases_that_share_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text("x: " + "[" * 63 + "1" + "]" * 63 + "\nopt: &o {lr: 0.1}\nagain: *o\n")
    values = load_config(path).values
    assert values["again"] == {"lr": 0.1}
    depth, inner = 0, values["x"]
    while isinstance(inner, list):
        depth, inner = depth + 1, inner[0]
    assert (depth, inner) == (63, 1)


def test_a_config_file_past_the_size_bound_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    from trackway.receipts.config import MAX_CONFIG_BYTES

    path = tmp_path / "big.yaml"
    with path.open("w") as file:
        file.write("x: ")
        file.write("a" * MAX_CONFIG_BYTES)
    with pytest.raises(InputError, match="larger than 16 MiB"):
        load_config(path)


@pytest.mark.parametrize(("item", "expected"), [
    (".".join(["k"] * 5000) + "=1", "--set: KEY has 5000 dotted parts; expected at most 64"),
    ("a=" + "[" * 5000 + "]" * 5000, "nested more than 64 levels deep"),
    (".".join(["k"] * 60) + "=" + "[" * 10 + "]" * 10, "nested more than 64 levels deep"),
])
def test_set_keys_and_values_have_the_same_depth_bound(item: str, expected: str) -> None:
    with pytest.raises(InputError) as refused:
        load_config(None, [item])
    assert expected in str(refused.value) and len(str(refused.value)) < 400
