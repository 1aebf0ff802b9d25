"""The dispatch table (impls/triton_rmsnorm/dispatch_table.py): its file format, its lookup rule,
the public path override and the tuning session's harvest (dispatch.py), on the CPU."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from impls.triton_rmsnorm import direct, dispatch, dispatch_table, launch, replays
from impls.triton_rmsnorm.dispatch_table import Entry, Key, Table
from tests.conftest import DEVICE
from tests.helpers import H200_FACTS

BF16 = ("bfloat16",) * 3
KEY = Key("fwd", BF16, False)


def _entry(n: int, m: int, path: str = "single_tile", key: Key = KEY, **config) -> Entry:
    return Entry(key, n, m, path, {"rmsnorm_fwd_kernel": {"BLOCK_M": 1, "num_warps": 4, **config}})


def test_gpu_slug():
    assert dispatch_table.gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert dispatch_table.gpu_slug("NVIDIA GeForce RTX 4090") == "nvidia-geforce-rtx-4090"
    with pytest.raises(ValueError, match="device_name"):
        dispatch_table.gpu_slug("  ")


def test_table_round_trips_one_entry_a_line_sorted(tmp_path):
    table = Table([_entry(4096, 512), _entry(2048, 8), _entry(2048, 1)], {"gpu": "NVIDIA H200"})
    path = tmp_path / "t.json"
    table.save(path)
    text = path.read_text()
    data = json.loads(text)
    assert data["format"] == dispatch_table.FORMAT and data["gpu"] == "NVIDIA H200"
    assert [(e["n"], e["m"]) for e in data["entries"]] == [(2048, 1), (2048, 8), (4096, 512)]
    entry_lines = [line for line in text.splitlines() if line.lstrip().startswith('{"direction"')]
    assert len(entry_lines) == 3  # one entry a line: a diff shows each decision
    loaded = Table.load(path)
    assert loaded.entries() == table.entries() and loaded.meta == {"gpu": "NVIDIA H200"}
    assert not list(tmp_path.glob("*.tmp"))  # the atomic write left nothing behind


def test_lookup_rule_same_padded_width_then_nearest_n_then_nearest_m_class():
    table = Table([_entry(2560, 64), _entry(3072, 8), _entry(3072, 4096), _entry(4096, 1),
                   _entry(8192, 512)])  # fmt: skip
    # N = 3000 pads to 4096: of 2560, 3072 and 4096 (all padded to 4096) 3072 is nearest
    assert table.lookup(KEY, 3000, 100).m == 8  # floor(log2 100) = 6: 8 (3) nearer than 4096 (12)
    assert table.lookup(KEY, 3000, 3000).m == 4096
    # a tie in N's log distance takes the larger N; in M's, the larger class
    assert table.lookup(KEY, int((2560 * 3072) ** 0.5) + 1, 1).n == 3072
    assert table.lookup(KEY, 3072, 181).m == 8  # floor(log2 181) = 7: 8 (3) is 4 off, 4096 5
    tie = Table([_entry(1024, 8), _entry(1024, 128)])
    assert tie.lookup(KEY, 1024, 63).m == 128  # floor(log2 63) = 5: 3 and 7 both 2 off
    # no entry of the same padded width (2048's, 16384's): nothing, the heuristic serves
    assert table.lookup(KEY, 2048, 64) is None
    assert table.lookup(KEY, 9000, 64) is None
    # another key family: nothing
    assert table.lookup(Key("fwd", BF16, True), 4096, 1) is None
    assert table.lookup(Key("bwd", ("bfloat16",) * 4, False), 4096, 1) is None
    # 5000..8192 pad to 8192
    assert table.lookup(KEY, 5000, 1).n == 8192


def test_later_entries_replace_and_merged_prefers_the_overlay():
    base = Table([_entry(4096, 64, num_warps=4)])
    over = Table([_entry(4096, 64, num_warps=8), _entry(4096, 1)])
    merged = base.merged(over)
    assert len(merged) == 2
    assert merged.lookup(KEY, 4096, 64).configs["rmsnorm_fwd_kernel"]["num_warps"] == 8
    assert (KEY, 4096, 1) in merged and (KEY, 4096, 8) not in merged


@pytest.mark.parametrize(
    "text, message",
    [
        ("[]", "format"),
        ('{"format": "other"}', "format"),
        (json.dumps({"format": dispatch_table.FORMAT, "entries": [{"direction": "fwd"}]}), "lacks"),
        (json.dumps({"format": dispatch_table.FORMAT, "entries": [{**_entry(64, 1).to_json(), "direction": "up"}]}), "direction"),
        (json.dumps({"format": dispatch_table.FORMAT, "entries": [{**_entry(64, 1).to_json(), "n": 0}]}), "n expected"),
        (json.dumps({"format": dispatch_table.FORMAT, "entries": [{**_entry(64, 1).to_json(), "dtypes": ["half"] * 3}]}), "dtype"),
        ("{", "not JSON"),
    ],
)  # fmt: skip
def test_bad_tables_are_rejected_with_the_file_named(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as error:
        Table.load(path)
    assert "bad.json" in str(error.value)


def test_committed_tables_are_package_data():
    pyproject = (dispatch_table.TABLES_DIR.parents[2] / "pyproject.toml").read_text()
    (data,) = [
        line for line in pyproject.splitlines() if line.startswith('"impls.triton_rmsnorm" =')
    ]
    assert '"tables/*.json"' in data and '"tables/fp8/*.json"' in data
    for path in dispatch_table.TABLES_DIR.glob("*.json"):
        Table.load(path)  # every committed table parses
    from impls.triton_rmsnorm import fp8_table

    for path in fp8_table.FP8_TABLES_DIR.glob("*.json"):
        fp8_table.load(path)  # and every fp8 launch table


def test_path_names():
    assert dispatch.path_name(launch._forward_single_tile) == "single_tile"
    assert dispatch.path_name(launch._forward_looped) == "looped"
    assert dispatch.path_name(launch._backward_wide) == "wide"
    assert dispatch.path_name(launch._HELD_ROW_BACKWARDS[0]) == "held_row(warps=16)"
    group = launch._held_group_forward_path(launch.HELD_GROUP_FORWARDS[0])
    assert dispatch.path_name(group) == "held_group(slice_n=4096,ring=3,per_sm=6,warps=4)"
    assert dispatch.is_group_path(dispatch.path_name(group))


def _forward(n: int, m: int = 3):
    torch.manual_seed(0)
    x = torch.randn(m, n, device=DEVICE)
    w = torch.randn(n, device=DEVICE)
    return x, w


def test_override_forces_a_path_through_the_front_door():
    n = launch.FORWARD_LOOPED_FROM_N + 64  # single tile (default) or looped
    x, w = _forward(n)
    launch.take_launch_configs()
    default = launch.rmsnorm_forward(x, w, 1e-6)[0]
    assert "rmsnorm_fwd_kernel" in launch.take_launch_configs()
    with dispatch.override(forward="looped"):
        forced = launch.rmsnorm_forward(x, w, 1e-6)[0]
    assert set(launch.take_launch_configs()) == {"rmsnorm_fwd_looped_kernel"}
    torch.testing.assert_close(forced, default)
    with (
        dispatch.override(forward="held_row"),
        pytest.raises(ValueError, match="offered: single_tile, looped"),
    ):
        launch.rmsnorm_forward(x, w, 1e-6)  # fmt: skip
    with pytest.raises(TypeError, match="forward"), dispatch.override(forward=1):
        pass
    assert not dispatch.overridden()


def test_override_reaches_a_backward_run_on_another_thread(python_host_path):
    """Autograd runs a CUDA backward on a thread of its own, where the thread-local override of
    the forward's thread is not seen: the forward hands its overrides to its backward. Here the
    backward runs on a new thread (any device); forcing a path not offered must raise there."""
    from impls.triton_rmsnorm.function import rmsnorm

    x = torch.randn(4, 256, device=DEVICE, requires_grad=True)
    w = torch.randn(256, device=DEVICE, requires_grad=True)

    def backward_on_a_thread(y) -> list:
        errors = []

        def run():
            try:
                y.sum().backward()
            except Exception as error:  # noqa: BLE001 (handed to the test's thread)
                errors.append(error)

        thread = threading.Thread(target=run)
        thread.start()
        thread.join(120)
        return errors

    with dispatch.override(backward="wide"):
        forced = rmsnorm(x, w)
    (error,) = backward_on_a_thread(forced)
    assert isinstance(error, ValueError) and "'wide' is not offered" in str(error)
    assert backward_on_a_thread(rmsnorm(x, w)) == []  # the override ended with its block
    assert not dispatch.overridden()
    # the forward's choice wins over an override around the backward on the calling thread (as
    # on CUDA, where that thread's overrides are not seen), and the stack is restored after
    with dispatch.override(forward="single_tile"):
        both = rmsnorm(x, w) * 1
    with dispatch.override(backward="wide"):
        forced_again = rmsnorm(x, w)
    with dispatch.override(backward="single_tile"):
        with pytest.raises(ValueError, match="'wide' is not offered"):
            forced_again.sum().backward()
        assert dispatch.forced("bwd") == "single_tile"
    assert not dispatch.overridden()
    # a forward-only override is not handed on: the backward still replays its launches
    rmsnorm(x, w).sum().backward()  # (records this signature's backward replay)
    before = direct.replayed_launches
    assert backward_on_a_thread(both) == []
    assert direct.replayed_launches > before


def test_a_kernel_tests_override_serves_a_path_not_offered_with_replays_of_its_own(
    python_host_path,
):
    """override(offered_only=False): the named path serves calls it is not offered for (the
    two-role backward at 100 columns), replays its own launches, and leaves the calls after the
    block to the launcher's own path and replays; two-level rows still take the single tile."""
    from impls.triton_rmsnorm.function import rmsnorm

    x = torch.randn(6, 100, device=DEVICE, requires_grad=True)
    w = torch.randn(100, device=DEVICE, requires_grad=True)
    dy = torch.randn(6, 100, device=DEVICE)
    assert [dispatch.path_name(p) for p in launch.backward_paths(x, x, w, None)] == ["single_tile"]
    launch.take_launch_configs()
    with dispatch.override(backward="two_role", offered_only=False):
        before = direct.replayed_launches
        grads = [torch.autograd.grad(rmsnorm(x, w), (x, w), dy) for _ in range(3)]
        assert direct.replayed_launches - before == 2 * 2  # calls 2, 3: forward and backward
        assert "rmsnorm_bwd_two_role_kernel" in launch.take_launch_configs()
        assert launch._replays_as_single_tile()
    torch.autograd.grad(rmsnorm(x, w), (x, w), dy)
    assert set(launch.take_launch_configs()) >= {"rmsnorm_bwd_kernel"}  # the single tile again
    assert "rmsnorm_bwd_two_role_kernel" not in launch.take_launch_configs()
    for later in grads[1:]:
        assert all(torch.equal(a, b) for a, b in zip(grads[0], later, strict=True))
    with dispatch.override(backward="held_row", offered_only=False):
        assert not launch._replays_as_single_tile()  # its launches take other arguments
    with (
        dispatch.override(backward="nothing", offered_only=False),
        pytest.raises(ValueError, match="no backward path is named 'nothing'"),
    ):
        torch.autograd.grad(rmsnorm(x, w), (x, w), dy)
    heads = torch.randn(4, 6, 64, device=DEVICE)[:, :4]  # two levels: [outer, heads, N]
    with dispatch.override(forward="looped", offered_only=False):
        assert launch.forward_paths(heads, heads, torch.ones(64), False) == [
            launch._forward_single_tile
        ]
    with pytest.raises(TypeError, match="offered_only"), dispatch.override(offered_only=1):
        pass
    assert not dispatch.overridden()


def test_override_bypasses_replays():
    x, w = _forward(256)
    launch.rmsnorm_forward(x, w, 1e-6)
    launch.rmsnorm_forward(x, w, 1e-6)  # recorded: a replay now serves this signature
    assert replays.recorded()
    # a replay would serve the call without looking at the override; the dispatch raises
    with dispatch.override(forward="looped"), pytest.raises(ValueError, match="not offered"):
        launch.rmsnorm_forward(x, w, 1e-6)


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="CPU only: the harvest run tunes for real on a GPU (test_tuning.py measures there)",
)
def test_a_tuning_session_harvests_the_measured_path_and_its_configurations(tmp_path, monkeypatch):
    """dispatch.tune_call with the timing replaced (the CPU cannot time): the entry holds the
    picked path's name and the configurations its kernels launched, and is saved; the grouped
    paths are not offered to the measurement unless allowed."""
    monkeypatch.setattr(dispatch, "private_stream", lambda index: None)
    path = tmp_path / "cache.json"
    session = dispatch._Session(Table(), path, allow_group=False)
    x, w = _forward(256)
    y = torch.empty_like(x)
    rstd = torch.empty(x.shape[0], device=DEVICE)
    args = (x, w, y, rstd, x, x, (256, 256, 256, 256), 1e-6, 0.0, False)
    group = launch._held_group_forward_path(launch.HELD_GROUP_FORWARDS[0])
    offered = []

    def fastest(paths, _args):
        offered.extend(paths)
        assert dispatch.measuring()
        return paths[1]

    paths = [launch._forward_single_tile, launch._forward_looped, group]
    dtypes = (x.dtype, w.dtype, y.dtype)
    dispatch.tune_call(session, "fwd", dtypes, False, 256, 3, paths, args, x.device, fastest,
                       dispatch.path_name)  # fmt: skip
    assert offered == paths[:2]
    assert not dispatch.measuring()
    (entry,) = Table.load(path).entries()
    assert entry.key == Key("fwd", ("float32",) * 3, False) and (entry.n, entry.m) == (256, 2)
    assert entry.path == "looped"
    assert set(entry.configs) == {"rmsnorm_fwd_looped_kernel"}
    assert entry.configs["rmsnorm_fwd_looped_kernel"]["num_warps"] == 4  # the interpreter's
    torch.testing.assert_close(y, launch.rmsnorm_forward(x, w, 1e-6)[0])


def test_one_tuning_session_at_a_time(tmp_path):
    with dispatch.tuning(tmp_path / "a.json") as table:
        assert isinstance(table, Table)
        with pytest.raises(RuntimeError, match="already open"), dispatch.tuning():
            pass
    with dispatch.tuning():
        pass


def test_tuner_cli_lists_its_grid(capsys):
    from impls.triton_rmsnorm import tune

    assert tune.main(["--list", "--directions", "fwd", "--dtypes", "bf16", "--no-presets",
                      "--n", "64,4096", "--m", "1,16384", "--max-elements", str(1 << 20)]) == 0  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "3 points"  # 4096 x 16384 is past --max-elements
    assert "fwd bfloat16 - n=64 m=16384" in lines
    with pytest.raises(SystemExit):
        tune.parse_args(["--dtypes", "int8"])
    points = tune.grid(tune.parse_args(["--dtypes", "fp32", "--no-presets"]))
    assert {p[3] for p in points} == {1024, 2048, 4096, 8192}  # fp32 takes fewer widths


def test_tuner_main_sweeps_saves_resumes_with_merge_and_stops_on_budget(
    tmp_path, monkeypatch, reading_tables
):
    """tune.main's loop with the GPU call replaced (each point adds the entry its tuning would):
    every point saved as it finishes, --merge skips what the table holds, --budget-s stops
    between points, a failing point is reported and the sweep goes on."""
    from impls.triton_rmsnorm import tune

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    reading_tables(True)
    ran = []

    def run_point(point, device):
        ran.append(point)
        if point[3] == 512 and point[0] == "bwd":
            raise torch.OutOfMemoryError("no room")
        key, n, m = tune._point_key(point)
        dispatch.add_entry(Entry(key, n, m, "single_tile", {}))

    monkeypatch.setattr(tune, "run_point", run_point)
    out = tmp_path / "t.json"
    grid = ["--out", str(out), "--n", "256,512", "--m", "1,64", "--dtypes", "bf16",
            "--no-batch-invariance"]  # fmt: skip
    assert tune.main(grid) == 0
    assert len(ran) == 8 and len(Table.load(out)) == 6  # two backward points failed
    ran.clear()
    assert tune.main([*grid, "--merge"]) == 1  # nothing new, only failures: rc 1
    assert [p[3] for p in ran] == [512, 512]  # only the failed ones are tried again
    assert len(Table.load(out)) == 6
    ran.clear()
    clock = iter(range(0, 1000, 10))
    monkeypatch.setattr(tune.time, "perf_counter", lambda: next(clock))
    # a fresh table; the clock moves 10 s a reading, 3 readings a point: 2 points in 45 s
    assert tune.main([*grid[:-1], "--budget-s", "45"]) == 0
    assert len(ran) == 2 and len(Table.load(out)) == 2
    assert Table.load(out).meta["gpu"] == "NVIDIA H200"
    # --retune: the grid's held points measured again and replaced, the others kept as they were
    made_with = Table.load(out).meta["made_with"]
    other = Entry(dispatch.entry_key("fwd", (torch.bfloat16,) * 3, False), 4096, 1, "looped", {})
    kept = Table([*Table.load(out).entries(), other], Table.load(out).meta)
    kept.save(out)
    ran.clear()
    monkeypatch.setattr(tune.time, "perf_counter", lambda: 0.0)
    assert tune.main([*grid, "--m", "1", "--merge", "--retune"]) == 0
    assert sorted((p[0], p[3]) for p in ran) == [("bwd", 256), ("bwd", 512), ("fwd", 256),
                                                  ("fwd", 512)]  # fmt: skip
    table = Table.load(out)
    assert (other.key, 4096, 1) in table and table.lookup(other.key, 4096, 1).path == "looped"
    assert table.meta["made_with"] == made_with and len(table.meta["retuned"]) == 1
    assert table.meta["retuned"][0]["m"] == [1]
    assert tune.main([*grid, "--retune"]) == 2  # it needs --merge


def test_unify_without_gpu_gives_each_width_its_largest_m_class_pick(tmp_path):
    """The blunt batch-invariance rule: a forward width whose entries differ takes its largest M
    class's pick at every M; other dtypes, the backward and uniform widths are left alone."""
    from impls.triton_rmsnorm import tune

    fp16, bf16 = Key("fwd", ("float16",) * 3, False), Key("fwd", ("bfloat16",) * 3, False)
    small = {"rmsnorm_fwd_kernel": {"BLOCK_M": 1, "num_warps": 4}}
    large = {"rmsnorm_fwd_kernel": {"BLOCK_M": 4, "num_warps": 8}}
    bwd = Key("bwd", ("float16",) * 4, False)
    table = Table([
        Entry(fp16, 4096, 1, "single_tile", small), Entry(fp16, 4096, 4096, "single_tile", large),
        Entry(fp16, 2048, 1, "single_tile", small), Entry(fp16, 2048, 4096, "single_tile", small),
        Entry(bf16, 4096, 1, "single_tile", small), Entry(bf16, 4096, 4096, "single_tile", large),
        Entry(bwd, 4096, 1, "single_tile", {}), Entry(bwd, 4096, 4096, "wide", {}),
    ])  # fmt: skip
    path = tmp_path / "t.json"
    table.save(path)
    assert tune.main(["--unify-without-gpu", "--out", str(path), "--dtypes", "fp16"]) == 0
    got = Table.load(path)
    assert got.lookup(fp16, 4096, 1).configs == large  # unified
    assert got.lookup(fp16, 2048, 1).configs == small  # one pick already
    assert got.lookup(bf16, 4096, 1).configs == small  # not chosen
    assert got.lookup(bwd, 4096, 1).path == "single_tile"  # the backward is left alone
    assert got.meta["unified_without_gpu"] == ["float16"]
    assert tune.main(["--unify-without-gpu", "--out", str(tmp_path / "missing.json")]) == 2


#: A forward family on the CPU for the same-bits re-pick: 64 rows of 256 bf16 columns (its
#: largest class) and a smaller class of 8 rows.
_REPICK_N, _REPICK_REF_M, _REPICK_M = 256, 64, 8
_REF_CONFIG = {
    "BLOCK_M": 4,
    "PROGRAMS_PER_SM": 0,
    "LOOP_STAGES": 1,
    "num_warps": 1,
    "num_stages": 1,
}


def _repick_family():
    from impls.triton_rmsnorm import batch_invariance as invariance

    ref = Entry(KEY, _REPICK_N, _REPICK_REF_M, "single_tile", {"rmsnorm_fwd_kernel": _REF_CONFIG})
    return invariance, ref, invariance._family_probe(KEY, _REPICK_N, ref, torch.device(DEVICE))


def test_same_bits_configs_keep_exactly_the_configurations_that_give_the_wanted_bits():
    """invariance.same_bits_configs: the tuner's candidates at m rows (and `also`) whose y rows, forced
    at each, are bitwise the largest class's; none when the wanted rows differ in one element.
    (On the CPU every configuration gives the same bits: the interpreter's sums do not follow
    the warps; the GPU re-pick's log shows the filter at work, probes/*-tune-repick.log.)"""
    invariance, ref, (x, w, r, rows, want) = _repick_family()
    kept = invariance.same_bits_configs(_REPICK_N, _REPICK_M, x, w, r, rows, want, [_REF_CONFIG])
    assert kept and _REF_CONFIG in kept
    assert all(set(c) == set(_REF_CONFIG) for c in kept)
    with dispatch.override(forward="single_tile", forward_configs={"rmsnorm_fwd_kernel": kept[-1]}):
        assert torch.equal(invariance._y_rows(x, w, r, rows, _REPICK_M), want)
    other = want.clone()
    other[rows - 1, 7] = other[rows - 1, 7] * 2 + 1
    assert invariance.same_bits_configs(_REPICK_N, _REPICK_M, x, w, r, rows, other) == []


def test_repick_takes_the_fastest_same_bits_configuration_below_the_largest_class(monkeypatch):
    """invariance.repick_same_bits: an entry below its width's largest class takes the configuration
    the tuner's timer (tuning.fastest, stubbed here: it picks the candidate of most warps)
    finds fastest among those keeping the largest class's bits; the largest class, classes not
    asked for, other dtypes and a family whose largest class is another path are left alone."""
    from impls.triton_rmsnorm import tuning

    invariance, ref, _ = _repick_family()
    seen = []

    def most_warps(candidates, run, args, passes=1):
        seen.append(list(candidates))
        return max(candidates, key=lambda c: (c["num_warps"], c["BLOCK_M"]))

    monkeypatch.setattr(tuning, "fastest", most_warps)
    old = {"rmsnorm_fwd_kernel": {**_REF_CONFIG, "BLOCK_M": 8, "num_warps": 2}}
    fp16 = Key("fwd", ("float16",) * 3, False)
    looped = Entry(KEY, 512, 64, "looped", {})
    table = Table([
        ref, Entry(KEY, _REPICK_N, _REPICK_M, "single_tile", old),
        Entry(KEY, _REPICK_N, 1, "single_tile", old),  # a class not asked for
        Entry(fp16, _REPICK_N, _REPICK_M, "single_tile", old), Entry(fp16, _REPICK_N, 64, "single_tile", old),
        looped, Entry(KEY, 512, 8, "single_tile", old),  # its largest class is another path
    ])  # fmt: skip
    with dispatch.tuning(None, into=table):
        picked = invariance.repick_same_bits(table, torch.device(DEVICE), None, {_REPICK_M},
                                       {"bfloat16"}, {False})  # fmt: skip
    assert picked == 1 and len(seen) == 1 and _REF_CONFIG in seen[0]
    got = table.lookup(KEY, _REPICK_N, _REPICK_M)
    fastest = max(seen[0], key=lambda c: (c["num_warps"], c["BLOCK_M"]))
    assert fastest not in (_REF_CONFIG, old["rmsnorm_fwd_kernel"])
    assert got.path == "single_tile" and got.configs == {"rmsnorm_fwd_kernel": fastest}
    assert table.lookup(KEY, _REPICK_N, _REPICK_REF_M).configs == ref.configs
    assert table.lookup(KEY, _REPICK_N, 1).configs == old
    assert table.lookup(fp16, _REPICK_N, _REPICK_M).configs == old
    assert table.lookup(KEY, 512, 8).configs == old


def test_take_same_bits_falls_back_to_the_largest_class_where_no_configuration_keeps_its_bits():
    """invariance._take_same_bits (batch_invariance's step for an entry whose bits differ): with no
    configuration giving the wanted rows, the entry takes the largest class's path and
    configurations, and says the bits still differ."""
    invariance, ref, (x, w, r, rows, want) = _repick_family()
    other = want.clone()
    other[0, 0] = other[0, 0] * 2 + 1
    table = Table([ref, Entry(KEY, _REPICK_N, _REPICK_M, "looped", {})])
    with dispatch.tuning(None, into=table):
        said = invariance._take_same_bits(KEY, _REPICK_N, _REPICK_M, ref, x, w, r, rows, other)
    assert said == f"m={_REPICK_REF_M}'s choice (STILL DIFFERENT)"
    got = table.lookup(KEY, _REPICK_N, _REPICK_M)
    assert (got.path, got.configs) == (ref.path, ref.configs)


def test_least_regret_tree_weighs_every_class_and_keeps_the_current_tree_within_the_margin():
    """invariance.least_regret_tree: the tree of least worst ratio to each class's fastest time,
    over trees timed at every class (a tree missing at one class counts in that class's fastest
    but cannot be chosen); the current tree (0) stays unless another beats its worst ratio by
    more than the margin."""
    from impls.triton_rmsnorm.batch_invariance import least_regret_tree, worst_ratio

    # the 2048x4096 case: tree 1 is 5.6% faster at 2048 rows, 2.7% slower at 16384
    best = {2048: {0: 8.92, 1: 8.42}, 16384: {0: 66.6, 1: 68.4}}
    assert least_regret_tree(best) == 1
    assert worst_ratio(best, 0) == pytest.approx(8.92 / 8.42)
    assert worst_ratio(best, 1) == pytest.approx(68.4 / 66.6)
    # the largest class alone would keep tree 0; a class where tree 1 is far slower keeps it too
    assert least_regret_tree({**best, 1: {0: 1.30, 1: 1.50}}) == 0
    # tree 2 is fastest at 2048 but not timed at 16384: not chosen, yet it sets 2048's bar
    best_with_missing = {2048: {0: 8.92, 1: 8.42, 2: 8.0}, 16384: {0: 66.6, 1: 68.4}}
    assert least_regret_tree(best_with_missing) == 1
    assert worst_ratio(best_with_missing, 2) == float("inf")
    # within the margin the current tree stays; past it another is taken
    close = {1: {0: 1.005, 1: 1.0}, 8: {0: 1.0, 1: 1.0}}
    assert least_regret_tree(close) == 0
    assert least_regret_tree(close, margin=0.001) == 1
    assert least_regret_tree({}) is None
    assert least_regret_tree({1: {0: 1.0}, 8: {1: 1.0}}) is None  # no tree at every class
    assert least_regret_tree({1: {1: 2.0, 2: 1.0}, 8: {1: 1.0, 2: 1.5}}) == 2  # no current tree


def _joint_family(old):
    """A bf16 forward family at _REPICK_N for the joint re-pick: the largest class and two
    smaller ones, each at `old`'s configuration, beside a family whose classes are not all the
    single tile."""
    ref = Entry(KEY, _REPICK_N, _REPICK_REF_M, "single_tile", old)
    return Table([
        ref, Entry(KEY, _REPICK_N, _REPICK_M, "single_tile", old),
        Entry(KEY, _REPICK_N, 1, "single_tile", old),
        Entry(KEY, 512, 64, "looped", {}), Entry(KEY, 512, 8, "single_tile", old),
    ])  # fmt: skip


def _stub_times(monkeypatch, ms_of):
    """tuning.times stubbed: ms_of(config, m) for each candidate; records each group timed."""
    from impls.triton_rmsnorm import tuning

    timed = []

    def times(candidates, launch, args, passes=1):
        timed.append((args[0].shape[0], list(candidates)))
        return [ms_of(c, args[0].shape[0]) for c in candidates]

    monkeypatch.setattr(tuning, "times", times)
    return timed


def test_repick_jointly_gives_each_class_its_fastest_configuration_of_the_chosen_tree(monkeypatch):
    """invariance.repick_jointly on the CPU (the interpreter's sums do not follow the warps, so
    every configuration is one tree): each class of the family takes the configuration the
    timer finds fastest at that class (stubbed: the most warps, then the most rows a tile), and
    no width counts as changed (one tree); a family whose classes are not all the single tile
    is left alone. (The check through the dispatch passes trivially here: the interpreter runs
    its own configuration, not the table's; the next test models the GPU's rows.)"""
    invariance, _, _ = _repick_family()
    old = {"rmsnorm_fwd_kernel": {**_REF_CONFIG, "BLOCK_M": 8, "num_warps": 2}}
    table = _joint_family(old)
    timed = _stub_times(monkeypatch, lambda c, m: 1.0 / (c["num_warps"] * 16 + c["BLOCK_M"]))
    with dispatch.tuning(None, into=table):
        changed = invariance.repick_jointly(
            table, torch.device(DEVICE), None, {"bfloat16"}, {False}
        )
    assert changed == 0
    assert sorted(m for m, _ in timed) == [1, _REPICK_M, _REPICK_REF_M]  # one tree a class
    for m, candidates in timed:
        fastest = max(candidates, key=lambda c: (c["num_warps"], c["BLOCK_M"]))
        assert table.lookup(KEY, _REPICK_N, m).configs == {"rmsnorm_fwd_kernel": fastest}
        assert old["rmsnorm_fwd_kernel"] in candidates  # the entry's own configuration is tried
    assert table.lookup(KEY, 512, 8).configs == old


def _rows_by_warps(monkeypatch, invariance, table, fail_check=False):
    """_y_rows as a GPU gives them: the real rows, doubled where the configuration that runs
    (the forced one, else the session table's entry for the call's class) has 2 warps (a second
    reduction tree). fail_check: a call through the table's 2-warp entries raises instead."""
    from impls.triton_rmsnorm import overrides

    real = invariance._y_rows

    def y_rows(x, w, r, rows, m):
        forced = overrides.forced_configs("fwd")
        entry = table.lookup(KEY, x.shape[1], dispatch_table.m_class(m))
        config = (forced or entry.configs)["rmsnorm_fwd_kernel"]
        if fail_check and forced is None and config["num_warps"] == 2:
            raise KeyboardInterrupt("interrupted during the check")
        got = real(x, w, r, rows, m)
        return got * 2 if config["num_warps"] == 2 else got

    monkeypatch.setattr(invariance, "_y_rows", y_rows)


def _tree_one_wins(c, m):
    """Stubbed times: 2-warp configurations (tree 1) 10% faster at the small classes and 2%
    slower at the largest, the fewest rows a tile fastest among them; the rest 1.0."""
    if c["num_warps"] != 2:
        return 1.0
    return (0.9 if m < _REPICK_REF_M else 1.02) + 0.001 * c["BLOCK_M"]


def test_repick_jointly_writes_the_chosen_tree_at_every_class(monkeypatch):
    """invariance.repick_jointly where a GPU would see two trees (_rows_by_warps): the tree of
    least worst ratio (2 warps: 10% faster at the small classes, 2% slower at the largest)
    goes to every class of the width, each class its fastest configuration of that tree; the
    check through the dispatch passes and the width counts as changed."""
    invariance, _, _ = _repick_family()
    old = {"rmsnorm_fwd_kernel": dict(_REF_CONFIG)}
    table = _joint_family(old)
    _rows_by_warps(monkeypatch, invariance, table)
    timed = _stub_times(monkeypatch, _tree_one_wins)
    with dispatch.tuning(None, into=table):
        changed = invariance.repick_jointly(table, torch.device(DEVICE), {_REPICK_N})
    assert changed == 1
    for m in (1, _REPICK_M, _REPICK_REF_M):
        tree_one = [c for at, group in timed if at == m for c in group if c["num_warps"] == 2]
        want = min(tree_one, key=lambda c: _tree_one_wins(c, m))
        assert table.lookup(KEY, _REPICK_N, m).configs == {"rmsnorm_fwd_kernel": want}


def test_repick_jointly_puts_the_entries_back_when_the_check_is_interrupted(monkeypatch):
    """An interrupt (anything raised) while the new tree's entries are checked puts the width's
    old entries back before it propagates: a table never keeps a width whose classes run
    different trees."""
    invariance, _, _ = _repick_family()
    old = {"rmsnorm_fwd_kernel": dict(_REF_CONFIG)}
    table = _joint_family(old)
    _rows_by_warps(monkeypatch, invariance, table, fail_check=True)
    _stub_times(monkeypatch, _tree_one_wins)
    with dispatch.tuning(None, into=table), pytest.raises(KeyboardInterrupt):
        invariance.repick_jointly(table, torch.device(DEVICE), {_REPICK_N})
    for m in (1, _REPICK_M, _REPICK_REF_M):
        assert table.lookup(KEY, _REPICK_N, m).configs == old


def test_tune_refuses_m_classes_with_the_joint_repick(capsys):
    from impls.triton_rmsnorm import tune

    assert tune.main(["--repick-jointly", "--m", "512"]) == 2
    assert "--repick-jointly" in capsys.readouterr().err


def test_repick_jointly_takes_another_tree_only_where_its_bits_hold(monkeypatch):
    """invariance.repick_jointly with two trees (the rows of 2-warp configurations made to
    differ, _forced_rows stubbed): the tree of least worst ratio wins even where it is slower
    at the largest class; a tree whose bits the dispatch then does not give (on the CPU the
    real rows are tree 0's) leaves the family's entries as they were."""
    invariance, _, _ = _repick_family()
    real = invariance._forced_rows

    def forced_rows(n, m, x, w, r, rows, also=()):
        for config, y in real(n, m, x, w, r, rows, also):
            yield config, (y * 2 if config["num_warps"] == 2 else y)

    monkeypatch.setattr(invariance, "_forced_rows", forced_rows)
    # tree 1 (2 warps): 10% faster at the small classes, 2% slower at the largest
    _stub_times(monkeypatch, lambda c, m: (0.9 if m < _REPICK_REF_M else 1.02)
                if c["num_warps"] == 2 else 1.0)  # fmt: skip
    old = {"rmsnorm_fwd_kernel": dict(_REF_CONFIG)}
    table = _joint_family(old)
    printed = []
    monkeypatch.setattr("builtins.print", lambda *a, **k: printed.append(" ".join(map(str, a))))
    with dispatch.tuning(None, into=table):
        changed = invariance.repick_jointly(table, torch.device(DEVICE), {_REPICK_N})
    assert changed == 0
    said = next(line for line in printed if f"n={_REPICK_N}:" in line)
    assert "takes tree 1" in said and "entries kept" in said
    for m in (1, _REPICK_M, _REPICK_REF_M):
        assert table.lookup(KEY, _REPICK_N, m).configs == old


def test_choose_says_where_each_choice_comes_from(monkeypatch, reading_tables):
    """dispatch.choose (what dispatch.run runs, and explain shows) on a CUDA device without a
    GPU: the table's entry when its path is offered, the default when it is not or there is
    none, an override with or without the entry's configurations, each with its source."""
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(dispatch, "_INTERPRETING", False)
    key = dispatch.entry_key("fwd", (torch.bfloat16,) * 3, False)
    configs = {"rmsnorm_fwd_kernel": {"BLOCK_M": 2, "num_warps": 8}}
    found = {"entry": Entry(key, 4096, 512, "looped", configs)}
    monkeypatch.setattr(dispatch, "lookup", lambda *args: found["entry"])
    paths = [launch._forward_single_tile, launch._forward_looped]

    def choice():
        return dispatch.choose("fwd", (torch.bfloat16,) * 3, False, 4096, 600, paths, cuda)

    first = choice()
    assert (first.path, first.configs, first.source) == (paths[1], configs, "table")
    assert first.describe() == "the table's entry n=4096, m=512 of the dispatch table"
    found["entry"] = Entry(key, 4096, 512, "held_row", configs)  # not offered here
    assert choice()[:3] == (paths[0], None, "not_offered")
    assert "names 'held_row', which is not offered" in choice().describe()
    not_offered = pytest.raises(ValueError, match="not offered for this call; offered: single")
    with dispatch.override(forward="held_row"), not_offered:  # forcing it is an error
        choice()
    found["entry"] = Entry(key, 4096, 512, "looped", configs)
    with dispatch.override(forward="looped"):
        assert choice()[:3] == (paths[1], configs, "override_table")
    with dispatch.override(forward="single_tile"):
        assert choice()[:3] == (paths[0], None, "override")
        assert choice().describe() == ("dispatch.override forced 'single_tile', heuristic "
                                       "configurations")  # fmt: skip
    found["entry"] = None
    reading_tables(True)  # (the tests' conftest turns them off)
    assert choice()[:3] == (paths[0], None, "no_entry")
    reading_tables(False)
    assert choice().source == "autotune_off"
    cpu = dispatch.choose("fwd", (torch.bfloat16,) * 3, False, 4096, 600, paths,
                          torch.device("cpu"))  # fmt: skip
    assert cpu.source == "interpreter"


def test_explain_names_each_directions_path_source_and_configs(capsys):
    from impls.triton_rmsnorm import explain

    x = torch.empty((16, 256), dtype=torch.bfloat16, device=DEVICE)
    w = torch.empty((256,), dtype=torch.bfloat16, device=DEVICE)
    text = explain.explain(x, w)
    assert text.splitlines()[0].startswith("rmsnorm on ") and "M=16, N=256" in text
    assert "fwd: single_tile  (" in text and "\nbwd: " in text and "offered: " in text
    assert "  not offered:\n    split: N <= 65536: the single tile takes it" in text
    with dispatch.override(forward="single_tile"):
        assert "dispatch.override forced 'single_tile'" in explain.explain(x, w)
    assert explain.main(["8x64", "--dtype", "fp16", "--residual", "--device", DEVICE]) == 0
    printed = capsys.readouterr().out
    assert "M=8, N=64, x torch.float16" in printed and ", residual" in printed
    with pytest.raises(SystemExit):
        explain.main(["8by64"])
    if not torch.cuda.is_available():  # a usage error, not an AssertionError's traceback
        with pytest.raises(SystemExit):
            explain.main(["8x64", "--device", "cuda"])
        assert (
            "argument --device: cuda, but this machine has no CUDA device"
            in capsys.readouterr().err
        )


def test_explain_gpu_reads_that_gpus_committed_table_without_a_device(
    tmp_path, monkeypatch, capsys
):
    """explain --gpu CLASS reads tables/CLASS.json alone, on any machine: each direction's entry
    by the lookup rule (nearest measured width and M class), or 'no entry'; an unknown class
    is a usage error naming the committed ones."""
    from impls.triton_rmsnorm import explain

    bf16 = Key("fwd", ("bfloat16",) * 3, False)
    table = Table([Entry(bf16, 4096, 512, "single_tile", {"rmsnorm_fwd_kernel": {
        "BLOCK_M": 2, "LOOP_STAGES": 4, "PROGRAMS_PER_SM": 2, "num_stages": 4, "num_warps": 8}}),
        Entry(bf16, 4096, 16384, "looped", {})], {"gpu": "Test GPU X1"})  # fmt: skip
    table.save(tmp_path / "test-gpu-x1.json")
    monkeypatch.setattr(dispatch_table, "TABLES_DIR", tmp_path)
    text = explain.explain_table("Test GPU X1", 1024, 4096, torch.bfloat16)
    assert text.splitlines()[0].startswith("rmsnorm on Test GPU X1 (its committed table, "
                                           "test-gpu-x1.json): M=1024, N=4096")  # fmt: skip
    assert "fwd: single_tile  (the table's entry n=4096, m=512)" in text
    assert "'num_warps': 8" in text and "bwd: no entry" in text
    assert "fwd: looped  (the table's entry n=4096, m=16384)" in explain.explain_table(
        "test-gpu-x1", 8192, 4000, torch.bfloat16
    )  # the nearest M class, the width's family
    assert "fwd: no entry" in explain.explain_table("test-gpu-x1", 1024, 4096, torch.float16)
    assert explain.main(["1024x4096", "--gpu", "test-gpu-x1"]) == 0
    assert "fwd: single_tile  (the table's entry n=4096, m=512)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        explain.main(["1024x4096", "--gpu", "nvidia-a100"])
    err = capsys.readouterr().err
    assert "argument --gpu: expected a GPU class with a committed table (test-gpu-x1)" in err


@pytest.mark.parametrize("gpu", [False, True], ids=["cpu", "simulated-h200"])
def test_offers_give_the_launchers_paths_with_a_reason_for_each_left_out(
    pretend_device, monkeypatch, gpu
):
    """offers.py (explain's reasons) and the launcher's fast path lists agree on every call of
    a grid (widths across every threshold, M below and above the SM count, 16- and 32-bit,
    residual or not, aligned or not), on this machine and on a simulated Hopper-class GPU;
    every family left out says why."""
    from impls.triton_rmsnorm import held_paths, offers

    if gpu:
        if held_paths.gluon_kernels is None:
            pytest.skip("Gluon is not available in this Triton")
        pretend_device(**H200_FACTS)
    widths = [64, 1000, 4096, 16384, 16392, 32768, 65536, 65552, 131072, 262144]
    for n in widths:
        for m, dtype, residual, skew in [(4, torch.bfloat16, False, 0), (512, torch.float16, False, 0),
                                         (64, torch.float32, True, 0), (16, torch.bfloat16, False, 8)]:  # fmt: skip
            base = torch.empty((m, n + skew), dtype=dtype)
            x = base[:, skew:]  # skew 8: rows that do not start on 16 bytes
            y = torch.empty((m, n), dtype=dtype)
            w = torch.empty((n,), dtype=dtype)
            fwd = offers.forward_offers(x, y, w, residual)
            assert offers.offered_paths(fwd) == launch.forward_paths(x, y, w, residual), (m, n)
            dy = torch.empty((m, n), dtype=dtype)
            dh = dy if residual else None
            bwd = offers.backward_offers(x, dy, w, dh)
            assert offers.offered_paths(bwd) == launch.backward_paths(x, dy, w, dh), (m, n)
            for offer in fwd + bwd:
                assert (offer.reason is None) == bool(offer.paths), offer
                assert offer.reason is None or offer.reason.strip(), offer


# ---- one row a tile at grids under the SM count (configs.one_row_tiles) --------------------


def test_one_row_tiles_where_the_tiles_would_not_fill_the_sms():
    from impls.triton_rmsnorm import configs

    config = {"BLOCK_M": 2, "PROGRAMS_PER_SM": 0, "LOOP_STAGES": 1, "num_warps": 8,
              "num_stages": 1}  # fmt: skip
    one_row = {**config, "BLOCK_M": 1}
    # 16x8192 16-bit: 8 tiles on 132 SMs; 8 warps x 32 threads x 8 columns = 2048 <= 8192
    assert configs.one_row_tiles(config, 16, 8192, 2, 132) == one_row
    assert configs.one_row_tiles(config, 262, 8192, 2, 132) == one_row  # 131 tiles
    assert configs.one_row_tiles(config, 263, 8192, 2, 132) is config  # 132 tiles fill them
    # 16 warps of 8-column vectors span 4096 columns: at 2048 they split the rows among them
    wide_warps = {**config, "num_warps": 16}
    assert configs.one_row_tiles(wide_warps, 16, 2048, 2, 132) is wide_warps
    assert configs.one_row_tiles(wide_warps, 16, 4096, 2, 132)["BLOCK_M"] == 1
    assert configs.one_row_tiles(wide_warps, 16, 2048, 4, 132)["BLOCK_M"] == 1  # fp32 vectors
    # a persistent grid and a tile of one row already: as they are
    persistent = {**config, "PROGRAMS_PER_SM": 2}
    assert configs.one_row_tiles(persistent, 16, 8192, 2, 132) is persistent
    assert configs.one_row_tiles(one_row, 16, 8192, 2, 132) is one_row


def test_forced_forward_configurations_launch_as_given():
    """Under dispatch.override(forward_configs=...) the forward's configuration is not adjusted
    to M (a kernel test or a probe runs what it names); otherwise it is."""
    from impls.triton_rmsnorm import forward_launch

    x = torch.empty(16, 8192, dtype=torch.bfloat16)
    adjust = forward_launch._one_row_tiles(16, 8192, (x, x, x, x), torch.device("cpu"))
    assert adjust is not None
    forced = {"rmsnorm_fwd_kernel": {"BLOCK_M": 2, "PROGRAMS_PER_SM": 0, "LOOP_STAGES": 1,
                                     "num_warps": 8, "num_stages": 1}}  # fmt: skip
    with dispatch.override(forward="single_tile", forward_configs=forced):
        assert forward_launch._one_row_tiles(16, 8192, (x,), torch.device("cpu")) is None


def test_pretend_device_gives_every_device_its_facts_nests_and_forgets_cached_answers():
    """dispatch.pretend_device: inside the block every device (the CPU's interpreter included)
    reads the facts given, the inner block winning per fact; outside, its own again; cached
    answers computed from the facts (the grouped backward's programs an SM) are forgotten on
    entering and leaving; a fact it does not know, or a value of the wrong kind, is refused by
    name."""
    from impls.triton_rmsnorm import common, held_paths

    cpu = torch.device("cpu")
    own = (common._programs_cap(cpu), common._hopper_class(cpu), common._inline_ptx_runs())
    config = launch.HELD_GROUP_BACKWARDS[0]
    with dispatch.pretend_device(sm_count=132, capability=(9, 0), inline_ptx=True,
                                 shared_bytes_per_block=232448, shared_bytes_per_sm=233472):  # fmt: skip
        assert common._programs_cap(cpu) == 132 and common._sm_count(0) == 132
        assert common._hopper_class(cpu) and common._inline_ptx_runs()
        assert common._shared_bytes_per_block(0) == 232448
        wide = held_paths._held_group_backward_programs_per_sm(0, config)
        with dispatch.pretend_device(sm_count=8, shared_bytes_per_sm=config_bytes_for_one(config)):
            assert common._programs_cap(cpu) == 8 and common._hopper_class(cpu)  # outer kept
            assert held_paths._held_group_backward_programs_per_sm(0, config) == 1 < wide
        assert common._programs_cap(cpu) == 132
        assert held_paths._held_group_backward_programs_per_sm(0, config) == wide
        with dispatch.pretend_device(capability=(8, 0)):
            assert not common._hopper_class(cpu)
        with dispatch.pretend_device(name="NVIDIA H100 80GB HBM3"):
            assert common.gpu_name(0) == "NVIDIA H100 80GB HBM3"
    assert (common._programs_cap(cpu), common._hopper_class(cpu), common._inline_ptx_runs()) == own
    for facts, error, named in [
        ({"sms": 132}, TypeError, "sms"),
        ({"sm_count": 0}, ValueError, "sm_count"),
        ({"sm_count": 13.0}, ValueError, "sm_count"),
        ({"capability": "9.0"}, ValueError, "capability"),
        ({"inline_ptx": 1}, ValueError, "inline_ptx"),
        ({"shared_bytes_per_sm": -1}, ValueError, "shared_bytes_per_sm"),
        ({"name": ""}, ValueError, "name"),
        ({"name": 200}, ValueError, "name"),
    ]:
        with pytest.raises(error, match=named), dispatch.pretend_device(**facts):
            pass
    assert common._PRETENDED == {}


def config_bytes_for_one(config) -> int:
    """Shared memory an SM needs for one program of the grouped backward's configuration."""
    from impls.triton_rmsnorm import held_paths

    reserved = held_paths.SHARED_BYTES_RESERVED_PER_PROGRAM
    return held_paths._held_group_backward_shared_bytes(config) + reserved


def test_reading_tables_turns_the_tables_on_and_off_and_restores_the_setting():
    """dispatch.reading_tables: inside the block the setting holds (what dispatch.choose then
    says: test_choose_says_where_each_choice_comes_from), nested blocks unwind in order, after
    it the setting before it is back; anything but a bool is refused, naming the argument."""
    before = dispatch.heuristic_only()
    with dispatch.reading_tables(False):
        assert dispatch.heuristic_only()
        with dispatch.reading_tables(True):
            assert not dispatch.heuristic_only()
        assert dispatch.heuristic_only()
    assert dispatch.heuristic_only() == before
    with pytest.raises(TypeError, match="enabled: expected a bool"), dispatch.reading_tables(1):
        pass
    assert dispatch.heuristic_only() == before


def test_a_tuning_session_measures_every_kernel_anew():
    """Opening dispatch.tuning() forgets the kernel configurations tuned before in the process
    (kernel_launch's record of them), so that a session's choices are measured in it."""
    from impls.triton_rmsnorm import kernel_launch

    kernel_launch._TUNED[("a kernel", "an earlier tuning")] = {"num_warps": 4}
    with dispatch.tuning(None):
        assert not kernel_launch._TUNED


def test_every_committed_entry_launches_its_own_configuration():
    """A configuration outside its kernel's space is not launched (the heuristic runs instead):
    no committed table may hold one, or its entry would be measured and never run."""
    from impls.triton_rmsnorm import configs

    for path in dispatch_table.TABLES_DIR.glob("*.json"):
        for entry in Table.load(path).entries():
            for kernel, config in entry.configs.items():
                assert configs.in_config_space(kernel, config), (path.name, entry, kernel)


def test_a_table_configuration_outside_the_space_is_said_not_hidden(monkeypatch):
    """A hand-edited entry whose configuration no kernel takes: a RuntimeWarning naming the
    kernel and the configuration, once an entry, and the heuristic runs; explain marks it."""
    from impls.triton_rmsnorm import configs, explain

    typo = {"BLOCK_M": 3, "num_warps": 4}  # 3 rows a tile: no such tile
    assert not configs.in_config_space("rmsnorm_fwd_kernel", typo)
    some = dict(sorted(configs._config_space("rmsnorm_fwd_kernel"))[0])
    assert configs.in_config_space("rmsnorm_fwd_kernel", some)
    monkeypatch.setattr(dispatch._ACTIVE, "configs", {"rmsnorm_fwd_kernel": typo}, raising=False)
    said = r"rmsnorm_fwd_kernel \{'BLOCK_M': 3, 'num_warps': 4\} is not in the kernel's"
    with pytest.warns(RuntimeWarning, match=said):
        assert configs._table_config("rmsnorm_fwd_kernel") is None
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert configs._table_config("rmsnorm_fwd_kernel") is None  # said once
    assert explain._config_text("rmsnorm_fwd_kernel", typo).endswith("the heuristic runs instead)")
    assert "heuristic" not in explain._config_text("rmsnorm_fwd_kernel", some)


def test_a_path_not_offered_names_the_condition_it_fails_with_its_numbers():
    """offers (what explain prints) names the first condition a call fails, not every one."""
    from impls.triton_rmsnorm import offers

    def why(m, n, family):
        x = torch.empty((m, n), dtype=torch.bfloat16)
        w = torch.empty((n,), dtype=torch.bfloat16)
        found = {o.name: o.reason for o in offers.backward_offers(x, torch.empty_like(x), w, None)}
        return found[family]

    assert (
        why(8, 1000, "two_role") == "N = 1000 outside 2048-16384 (TWO_ROLE_MIN_N, TWO_ROLE_MAX_N)"
    )
    assert why(2048, 6144, "two_role").startswith("M x N = 12582912 elements > ")
    assert why(16, 6144, "two_role").startswith("x and dy (0 MiB) not within half of this GPU's L2")
    assert why(16, 6144, "held_row") == "N = 6144 outside (16384, 32768]"
    assert why(16, 6144, "held_group") == "N = 6144 <= 16384"
    # suitable tensors on the interpreter: the GPU is what fails, not the tensors
    assert why(16, 20480, "held_row").startswith("needs an NVIDIA GPU and a Triton with Gluon")
    assert why(16, 40960, "held_group").startswith("needs an NVIDIA GPU and a Triton with Gluon")
