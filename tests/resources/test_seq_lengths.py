"""Length distributions and the padded length they lead to, on the notes' cases and real files."""

from __future__ import annotations

import json

import pytest

from memory_cases import lognormal_lengths
from trackway.errors import InputError
from trackway.resources.seq_lengths import (
    Lengths,
    batch_shape,
    lengths_from_values,
    read_jsonl_lengths,
    read_lengths_file,
)


def test_uniform_lengths_pad_to_the_quantile_of_the_batch_maximum():
    # Case 5: U(0, 8192), b = 4: p50 = 6888.6, p99 = 8171.4, P(s_pad ≤ 4096) = 0.0625.
    lengths = lengths_from_values(range(1, 8193))
    assert batch_shape(lengths, 0.5, 4, "dynamic", None).row_length == pytest.approx(6888.6, abs=1)
    assert batch_shape(lengths, 0.99, 4, "dynamic", None).row_length == pytest.approx(8171.4, abs=1)
    assert lengths.share_at_most(4096) ** 4 == pytest.approx(0.0625)
    assert batch_shape(lengths, None, 4, "dynamic", None).tokens == 4 * 8192


def test_a_mixture_meets_its_long_mode_in_18_5_percent_of_steps():
    # Case 6: 95% at 2048, 5% at 8192, b = 4.
    lengths = lengths_from_values([2048] * 95 + [8192] * 5)
    assert lengths.steps_with_longest(4) == pytest.approx(0.18549, abs=1e-5)
    assert batch_shape(lengths, 0.5, 4, "dynamic", None).row_length == 2048
    assert batch_shape(lengths, 0.99, 4, "dynamic", None).row_length == 8192
    assert 2500 * lengths.steps_with_longest(4) == pytest.approx(463.7, abs=0.1)


def test_the_motivating_lengths_pad_to_2730_at_the_median_and_the_cap_at_p99():
    lengths = lognormal_lengths()
    assert batch_shape(lengths, 0.5, 4, "dynamic", None).row_length == pytest.approx(2730, rel=0.01)
    assert batch_shape(lengths, 0.99, 4, "dynamic", None).row_length == 4096
    assert lengths.share_longest() == pytest.approx(0.047, abs=0.002)  # 4.7% of samples hit the cap
    assert lengths.steps_with_longest(4) == pytest.approx(0.175, abs=0.007)


def test_group_by_length_lowers_the_median_but_not_the_maximum():
    lengths = lognormal_lengths(20_000)
    grouped = batch_shape(lengths, 0.5, 4, "dynamic", None, group_by_length=True)
    assert grouped.row_length == pytest.approx(1500, rel=0.03)
    assert batch_shape(lengths, None, 4, "dynamic", None, group_by_length=True).row_length == 4096


def test_fixed_and_packed_padding_take_max_length_every_step():
    lengths = lengths_from_values([100, 200])
    for padding in ("fixed", "packed"):
        assert batch_shape(lengths, 0.5, 2, padding, 4096).tokens == 8192
    with pytest.raises(InputError, match="--max-length"):
        batch_shape(None, 0.5, 2, "packed", None)


def test_padding_free_counts_real_tokens_and_its_worst_batch_is_b_longest():
    lengths = lengths_from_values([1000] * 99 + [4000])
    median = batch_shape(lengths, 0.5, 4, "padding-free", None)
    assert median.tokens == 4000  # four rows of 1000 almost every time
    assert batch_shape(lengths, None, 4, "padding-free", None).tokens == 16_000


def test_lengths_file_and_jsonl_are_read_with_progress(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text("5\n\n7\n7\n")
    seen = []
    counts = read_lengths_file(path, seen.append)
    assert counts == {5: 1, 7: 2} and sum(seen) == path.stat().st_size
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps(row) for row in (
        {"meta": {"n": 3}, "text": "a b c d"}, {"meta": {"n": 9}, "text": "x"})) + "\n")
    assert read_jsonl_lengths(data, "meta.n") == ({3: 1, 9: 1}, False)
    assert read_jsonl_lengths(data, "text") == ({4: 1, 1: 1}, True)  # whitespace words: a proxy


@pytest.mark.parametrize("content, field, message", [
    ("12\nabc\n", None, "line 2: expected a whole number of tokens"),
    ("-3\n", None, "line 1: expected a length ≥ 0"),
    ('{"n": 3}\n{"m": 4}\n', "n", "line 2: expected a JSON object with field 'n'"),
    ('{"n": 3.5}\n', "n", "expected a token count, a list of token ids or text, got float"),
])
def test_bad_lengths_name_the_line(tmp_path, content, field, message):
    path = tmp_path / "in"
    path.write_text(content)
    with pytest.raises(InputError, match=message):
        read_lengths_file(path) if field is None else read_jsonl_lengths(path, field)


def test_no_lengths_at_all_is_refused():
    with pytest.raises(InputError, match="none were read"):
        Lengths({})
