"""rmsnorm_fp8's launch table (fp8_table.py) and its offline tuner's candidates (fp8_tune.py),
on the CPU: the file's format, the lookup order (this process's entries, the GPU class's table,
the heuristic), a broken file reported and skipped, the candidates' bounds."""

from __future__ import annotations

import json

import pytest
import torch

from impls.triton_rmsnorm import fp8, fp8_table, fp8_tune
from tests.conftest import ON_GPU


def _entry(scaling="block", block_n=4096, block_m=2, warps=8):
    return fp8_table.Fp8Entry(scaling, block_n, 2, block_m, warps, (4096, block_n), 12.5)


def test_a_table_saves_sorted_and_loads_back(tmp_path):
    path = tmp_path / "fp8" / "gpu.json"
    entries = [_entry("per_token", 8192), _entry("block", 4096), _entry("block", 128, 16, 4)]
    fp8_table.save(path, "NVIDIA H200", entries, {"date": "2026-12-02"})
    lines = path.read_text().splitlines()
    assert json.loads(lines[0] + "]}")["format"] == fp8_table.FORMAT
    assert [json.loads(line.rstrip(","))["block_n"] for line in lines[1:-1]] == [128, 4096, 8192]
    loaded = fp8_table.load(path)
    assert loaded == {e.key: e for e in entries}
    assert loaded[("block", 4096, 2, 0)].config == {"BLOCK_M": 2, "num_warps": 8}


@pytest.mark.parametrize(
    "text, match",
    [("{", "not JSON"), ('{"format": "other"}', "expected format"),
     ('{"format": "rmsnorm-fp8-launch-table/1", "entries": [{"scaling": "block"}]}', "lacks"),
     ('{"format": "rmsnorm-fp8-launch-table/1", "entries": [{"scaling": "x", "block_n": 128, '
      '"itemsize": 2, "BLOCK_M": 1, "num_warps": 4, "measured_at": [1, 128], "us": 1}]}',
      "scaling expected"),
     ('{"format": "rmsnorm-fp8-launch-table/1", "entries": [{"scaling": "block", "block_n": 100, '
      '"itemsize": 2, "BLOCK_M": 1, "num_warps": 4, "measured_at": [1, 128], "us": 1}]}',
      "block_n expected a power of two")],
)  # fmt: skip
def test_a_broken_table_names_its_file_and_the_problem(tmp_path, text, match):
    path = tmp_path / "broken.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=match) as error:
        fp8_table.load(path)
    assert str(path) in str(error.value)


@pytest.fixture
def on_a_tabled_gpu(monkeypatch, tmp_path, pretend_device):
    """fp8_launch_config as on a CUDA GPU whose class has a table in tmp_path."""
    name = f"Test GPU {tmp_path.name}"  # committed() caches per name: one of its own
    monkeypatch.setattr(fp8_table, "FP8_TABLES_DIR", tmp_path)
    monkeypatch.setattr(fp8.launch, "interpreting", lambda: False)
    pretend_device(name=name)
    return fp8_table.committed_path(name)


def test_the_lookup_takes_this_process_then_the_gpu_class_then_the_heuristic(on_a_tabled_gpu):
    fp8_table.save(on_a_tabled_gpu, "Test GPU", [_entry("block", 4096, 4, 16)], {})
    cuda = torch.device("cuda", 0)
    assert fp8.fp8_launch_config(4000, "block", 2, cuda) == {"BLOCK_M": 4, "num_warps": 16}
    heuristic = fp8.heuristic_fp8_launch_config(4096)
    assert fp8.fp8_launch_config(4000, "per_token", 2, cuda) == heuristic  # no entry
    assert fp8.fp8_launch_config(4000, "block", 2, torch.device("cpu")) == heuristic
    fp8.FP8_LAUNCH_TABLE[("block", 4096, 2, 0)] = {"BLOCK_M": 1, "num_warps": 8}
    try:
        assert fp8.fp8_launch_config(4000, "block", 2, cuda) == {"BLOCK_M": 1, "num_warps": 8}
    finally:
        del fp8.FP8_LAUNCH_TABLE[("block", 4096, 2, 0)]


def test_a_broken_committed_table_is_reported_and_the_heuristic_serves(on_a_tabled_gpu):
    on_a_tabled_gpu.write_text("{")
    with pytest.warns(RuntimeWarning, match="launch table skipped"):
        got = fp8.fp8_launch_config(2048, "block", 2, torch.device("cuda", 0))
    assert got == fp8.heuristic_fp8_launch_config(2048)


@pytest.mark.parametrize("block_n", fp8_tune.BLOCK_NS)
def test_the_tuners_candidates_stay_in_their_bounds(block_n):
    low, high = fp8_tune.ELEMENTS_PER_THREAD
    smallest, largest = fp8_tune.TILE_ELEMENTS
    found = fp8_tune.candidates(block_n)
    assert found
    for c in found:
        tile = c["BLOCK_M"] * block_n
        assert tile <= max(largest, block_n) and (tile >= smallest or c["BLOCK_M"] == 1)
        assert low <= tile // (32 * c["num_warps"]) <= high


@pytest.mark.skipif(ON_GPU, reason="CPU only: on a GPU this would tune and write the table")
def test_the_tuner_needs_a_gpu(capsys):
    assert fp8_tune.main([]) == 1
    assert "CUDA" in capsys.readouterr().err


def test_a_split_entry_saves_its_tail_and_the_padded_time_and_a_padded_one_does_not(tmp_path):
    path = tmp_path / "gpu.json"
    split = fp8_table.Fp8Entry("per_tensor", 4096, 2, 1, 8, (3640, 4608), 60.0, 512, 93.0)
    fp8_table.save(path, "NVIDIA H200", [_entry("per_tensor", 8192), split], {})
    items = [json.loads(line.rstrip(",")) for line in path.read_text().splitlines()[1:-1]]
    assert [("tail_n" in i, "padded_us" in i) for i in items] == [(True, True), (False, False)]
    loaded = fp8_table.load(path)
    assert loaded[("per_tensor", 4096, 2, 512)] == split
    assert loaded[("per_tensor", 8192, 2, 0)].tail_n == 0


@pytest.mark.parametrize("tail", [3, 4096, -512, 64])  # 64: narrower than a block's group
def test_a_tail_that_is_not_a_smaller_power_of_two_names_the_field(tmp_path, tail):
    path = tmp_path / "broken.json"
    item = {"scaling": "block", "block_n": 4096, "itemsize": 2, "BLOCK_M": 1, "num_warps": 8,
            "measured_at": [1, 4608], "us": 1.0, "tail_n": tail}  # fmt: skip
    path.write_text(json.dumps({"format": fp8_table.SPLIT_FORMAT, "entries": [item]}))
    with pytest.raises(ValueError, match="tail_n expected 0 or a power of two below block_n "
                                         "\\(128 at least per block\\)"):  # fmt: skip
        fp8_table.load(path)


def test_a_call_takes_the_split_tiles_only_where_a_table_has_their_entry(on_a_tabled_gpu):
    cuda = torch.device("cuda", 0)
    split = fp8_table.Fp8Entry("per_tensor", 4096, 2, 2, 16, (3640, 4608), 60.0, 512, 93.0)
    fp8_table.save(on_a_tabled_gpu, "Test GPU", [split], {})  # before the first (cached) read
    assert fp8.choose_tiles(4608, "per_token", 2, cuda) == (8192, 0)  # no split entry
    assert fp8.choose_tiles(4608, "per_token", 2, cuda, split=True) == (4096, 512)
    assert fp8.choose_tiles(4608, "per_tensor", 2, cuda) == (4096, 512)
    assert fp8.choose_tiles(4400, "per_tensor", 2, cuda) == (4096, 512)  # the same two tiles
    assert fp8.choose_tiles(4608, "per_tensor", 2, cuda, split=False) == (8192, 0)
    assert fp8.choose_tiles(4608, "per_tensor", 2, torch.device("cpu")) == (8192, 0)
    assert fp8.fp8_launch_config(4608, "per_tensor", 2, cuda, (4096, 512)) == {
        "BLOCK_M": 2, "num_warps": 16}  # fmt: skip
    assert fp8.fp8_launch_config(4608, "per_tensor", 2, cuda) == fp8.heuristic_fp8_launch_config(
        8192)  # fmt: skip


def test_the_split_tuner_writes_an_entry_only_where_the_split_was_faster(monkeypatch, tmp_path):
    faster = {4608}  # of the widths asked, the split beats the padded tile at 4608 only
    asked = []

    def tune_width(scaling, block_n, itemsize, elements, stream, tail_n=0, padded=None):
        asked.append((scaling, block_n, tail_n, padded))
        if block_n + tail_n not in faster:
            return None
        return fp8_table.Fp8Entry(scaling, block_n, itemsize, 1, 8, (1, block_n + tail_n), 50.0,
                                  tail_n, 90.0)  # fmt: skip

    monkeypatch.setattr(fp8_tune, "tune_width", tune_width)
    out = tmp_path / "gpu.json"
    fp8_table.save(out, "GPU", [_entry("per_tensor", 8192, 1, 32)], {})
    args = fp8_tune.parse_args(["--split-n", "4608", "5120", "4096", "7168", "--scalings",
                                "per_tensor", "--out", str(out)])  # fmt: skip
    entries = fp8_table.load(out)
    assert fp8_tune._tune_splits(args, "GPU", out, entries, {}, None, 0.0) == 0
    # 4096 and 7168 have no split with fewer columns; the padded tile's entry is the baseline
    assert asked == [("per_tensor", 4096, 512, {"BLOCK_M": 1, "num_warps": 32}),
                     ("per_tensor", 4096, 1024, {"BLOCK_M": 1, "num_warps": 32})]  # fmt: skip
    assert set(fp8_table.load(out)) == {("per_tensor", 8192, 2, 0), ("per_tensor", 4096, 2, 512)}


def test_a_table_with_split_entries_takes_the_second_format(tmp_path):
    """A reader of the first format refuses such a file (the heuristic serves) instead of
    taking a split entry's configuration for the padded tile of its BLOCK_N; a table of padded
    entries keeps the first format, so its bytes do not change."""
    padded, split = tmp_path / "padded.json", tmp_path / "split.json"
    fp8_table.save(padded, "GPU", [_entry("block", 4096)], {})
    fp8_table.save(split, "GPU", [_entry("block", 4096), fp8_table.Fp8Entry(
        "block", 4096, 2, 1, 8, (1, 4608), 9.0, 512, 11.0)], {})  # fmt: skip
    assert json.loads(padded.read_text())["format"] == fp8_table.FORMAT
    assert json.loads(split.read_text())["format"] == fp8_table.SPLIT_FORMAT
    assert len(fp8_table.load(split)) == 2


@pytest.mark.parametrize("value", ["0", "40000", "x"])
def test_split_widths_must_be_single_tile_widths(value, capsys):
    with pytest.raises(SystemExit):
        fp8_tune.parse_args(["--split-n", value])
    assert "--split-n: expected" in capsys.readouterr().err


def test_a_launch_table_entry_is_set_for_the_block_and_put_back():
    key, config = ("block", 4096, 2, 0), {"BLOCK_M": 2, "num_warps": 4}
    assert key not in fp8.FP8_LAUNCH_TABLE
    with fp8.launch_table_entry(key, config):
        assert fp8.FP8_LAUNCH_TABLE[key] == config
    assert key not in fp8.FP8_LAUNCH_TABLE
    earlier = {"BLOCK_M": 1, "num_warps": 8}
    fp8.FP8_LAUNCH_TABLE[key] = earlier
    try:
        with pytest.raises(RuntimeError, match="inside"), fp8.launch_table_entry(key, config):
            assert fp8.FP8_LAUNCH_TABLE[key] == config
            raise RuntimeError("inside")
        assert fp8.FP8_LAUNCH_TABLE[key] == earlier
        with fp8.launch_table_entry(key, None):  # None: the entry as it is
            assert fp8.FP8_LAUNCH_TABLE[key] == earlier
        assert fp8.FP8_LAUNCH_TABLE[key] == earlier
    finally:
        del fp8.FP8_LAUNCH_TABLE[key]
