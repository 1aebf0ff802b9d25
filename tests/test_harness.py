"""The measurement machinery: byte model, result files, ranking, and the compare CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import plots, report, results, shapes, traffic
from harness.compare import main as compare_main

#: The full seed-sweep run that results/README.md is generated from.
H200_SEED_RUN = Path("results/nvidia-h200/2026-12-04-f63c5edcc0a8-seed.jsonl")
#: A committed run from before results files had completion records and rows had elapsed_s.
H200_LEGACY_RUN = Path("results/nvidia-h200/2026-11-30-e4768343e8e4-add.jsonl")


def test_byte_model():
    assert traffic.counted_bytes("fwd", 4096, 8192, 2) == 2 * 4096 * 8192 * 2
    assert traffic.counted_bytes("bwd", 4096, 8192, 2) == 3 * 4096 * 8192 * 2
    assert traffic.counted_bytes("fwd", 8, 8, 2, op="add_rmsnorm") == 4 * 8 * 8 * 2
    assert traffic.counted_bytes("bwd", 8, 8, 2, op="add_rmsnorm") == 4 * 8 * 8 * 2
    assert traffic.copy_bytes(10, 10, 4) == 800
    assert traffic.gbps(10**9, 1000.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="op, mode"):
        traffic.counted_bytes("both", 1, 1, 2)
    with pytest.raises(ValueError, match="op, mode"):
        traffic.counted_bytes("fwd", 1, 1, 2, op="layernorm")
    with pytest.raises(ValueError, match="ms"):
        traffic.gbps(1, 0.0)


def test_presets_and_shape_parsing():
    assert shapes.resolve(["seed"], [])[:2] == [(512, 2048), (1024, 2048)]
    assert len(shapes.resolve(["seed"], [])) == 12
    assert all(m * n == 2**25 for m, n in shapes.PRESETS["narrow"][1])
    assert all(m * n >= 2**27 for m, n in shapes.PRESETS["large"][1])
    assert shapes.resolve([], ["4096x8192", "4096x8192"]) == [(4096, 8192)]
    with pytest.raises(ValueError, match="shape: expected MxN"):
        shapes.parse_shape("4096*8192")
    with pytest.raises(ValueError, match="preset: unknown"):
        shapes.resolve(["nope"], [])


def test_result_files_are_never_overwritten(tmp_path):
    path = tmp_path / "r.jsonl"
    first = results.ResultWriter(results.fresh_path(path))
    first.write({"kind": "provenance", "gpu": "X", "date": "2026-01-01"})
    first.write({"kind": "row", "backend": "a"})
    first.close()
    second_path = results.fresh_path(path)
    assert second_path != path and second_path.name == "r-2.jsonl"
    with pytest.raises(FileExistsError):
        results.ResultWriter(path)
    provenance, ceiling, rows = results.load(path)
    assert provenance["gpu"] == "X" and ceiling == {} and rows == [{"backend": "a"}]


def _row(backend, gbps, passed=True, suspect=False, shape="8x8", status="ok"):
    return {"backend": backend, "label": backend, "m": 8, "n": 8, "shape": shape, "dtype": "bf16",
            "mode": "fwd", "timing": "device", "status": status, "reason": None, "ms": 1 / gbps,
            "gbps": gbps, "pct_ceiling": gbps / 10, "suspect": suspect, "oracle_passed": passed,
            "oracle_max_ulps": 1.0}  # fmt: skip


def test_ranking_puts_failing_and_suspect_backends_below_passing_ones():
    rows = [_row("eager", 1.0), _row("fast-but-wrong", 9.0, passed=False),
            _row("too-fast", 20.0, suspect=True), _row("good", 5.0)]  # fmt: skip
    ranked = report.ranking(rows, "fwd", "device")
    assert [e["backend"] for e in ranked][:2] == ["good", "eager"]
    assert [e["rank"] for e in ranked] == [1, 2, "-", "-"]
    table = report.ranking_table(rows, "fwd", "device")
    assert "FAIL" in table and "SUSPECT" in table


def test_a_failing_backend_says_why_under_the_table():
    """The oracle's detail of each failing case is named under the ranked table (its first line
    that says something, without colour codes), a few cases a backend and a count of the rest."""
    detail = "CUDADialectError: \n\x1b[91merror[X]:\x1b[0m launch failed (1)\n\nmore text\n"
    rows = [_row("eager", 1.0), {**_row("wrong", 9.0, passed=False), "oracle_detail": detail}]
    rows += [{**_row("wrong", 9.0, passed=False, shape=f"{m}x8"), "m": m} for m in (16, 32, 64)]
    text = report.ranking_table(rows, "fwd", "device")
    assert "why FAIL:\n  wrong: oracle FAIL at 8x8 bf16: CUDADialectError: error[X]: launch " \
           "failed (1)" in text  # fmt: skip
    assert "wrong: oracle FAIL at 16x8 bf16: (no detail recorded)" in text
    assert "wrong: and 1 more failing cases" in text and "64x8" not in text


def test_unsupported_cases_show_with_their_reason():
    rows = [_row("a", 2.0), {**_row("b", 1.0, status="unsupported"), "reason": "N too wide"}]
    rows[1].pop("gbps")
    text = report.ranking_table(rows, "fwd", "device")
    assert "unsupported: N too wide" in text
    assert "unsupported" in report.per_shape_table(rows, "fwd", "device")


@pytest.mark.skipif(
    not __import__("torch").cuda.is_available(),
    reason="timings need CUDA (without it compare is a correctness run: tests/test_cli.py)",
)
def test_compare_prints_a_ranked_table(tmp_path, capsys):
    out = tmp_path / "gpu.jsonl"
    code = compare_main(["--backends", "triton", "eager", "--shape", "16x256", "--dtypes", "bf16",
                         "--out", str(out)])  # fmt: skip
    assert code == 0
    text = capsys.readouterr().out
    assert "| triton" in text and "| eager" in text
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records[0]["kind"] == "provenance" and records[-1]["kind"] == "complete"
    rows = [r for r in records if r["kind"] == "row"]
    assert {(r["backend"], r["mode"]) for r in rows} == {
        ("triton", "fwd"),
        ("triton", "bwd"),
        ("eager", "fwd"),
        ("eager", "bwd"),
    }
    assert all(r["status"] == "ok" and r["oracle_passed"] for r in rows)
    # each of our rows records the launch configuration it timed; peers record none
    launches = {r["mode"]: r["launch"] for r in rows if r["backend"] == "triton"}
    assert set(launches["fwd"]) == {"rmsnorm_fwd_kernel"}
    assert {"rmsnorm_fwd_kernel", "rmsnorm_bwd_kernel"} <= set(launches["bwd"])
    assert {"BLOCK_M", "num_warps", "num_stages"} <= set(launches["fwd"]["rmsnorm_fwd_kernel"])
    assert all(r["launch"] is None for r in rows if r["backend"] == "eager")
    page = tmp_path / "page.md"
    assert compare_main(["--from", str(out), "--markdown", str(page)]) == 0
    assert "Our launch configurations" in page.read_text() and "fwd: BLOCK_M=" in page.read_text()


def test_from_prints_the_committed_h200_ranking(capsys):
    assert compare_main(["--from", str(H200_SEED_RUN)]) == 0
    text = capsys.readouterr().out
    assert "GPU: NVIDIA H200" in text and "copy ceiling" in text
    for backend in ("triton", "eager", "compile", "apex"):
        assert f"| {backend}" in text


def test_from_a_folder_with_an_index_shows_its_runs_in_its_order_with_their_numbers(
    tmp_path, capsys
):
    """--from results/<gpu>/: the runs its INDEX.md lists, in its order and headed with the
    results page's run numbers, then the folder's other runs; a closing summary gives ours
    against the fastest peer per run, and the header says what the oracle columns mean."""
    import shutil

    folder = tmp_path / "gpu"
    folder.mkdir()
    shutil.copy(H200_SEED_RUN, folder / "a-seed.jsonl")
    shutil.copy(H200_LEGACY_RUN, folder / "b-add.jsonl")
    shutil.copy(H200_LEGACY_RUN, folder / "0-unlisted.jsonl")
    (folder / "probes").mkdir()
    shutil.copy(H200_LEGACY_RUN, folder / "probes" / "c-probe.jsonl")
    (folder / "INDEX.md").write_text("| run | file | plot | what |\n|---|---|---|---|\n"
                                     "| add | b-add.jsonl | - | x |\n| seed | a-seed.jsonl | - | y |\n"
                                     "| probe | probes/c-probe.jsonl | - | z |\n")  # fmt: skip
    assert compare_main(["--from", str(folder)]) == 0
    text = capsys.readouterr().out
    add, seed = text.index("# Run 1: add\n"), text.index("# Run 2: seed\n")
    unlisted = text.index("from " + str(folder / "0-unlisted.jsonl"))
    assert add < seed < text.index("# Run 3: probe\n") < unlisted  # probes/ runs it lists too
    summary = text[text.index("## Ours against the fastest oracle-passing peer, per run") :]
    assert "Run 1: add (" in summary and "Run 2: seed (" in summary
    assert "  rmsnorm fwd, device: " in summary and "  add_rmsnorm bwd, device: " in summary
    assert "err/bound: the largest error over the backend's written bound" in text


def test_from_several_runs_writes_one_page_with_ours_against_the_fastest_peer(tmp_path, capsys):
    """Each --from file is one run, ranked on its own; the page pivots ours against the fastest
    oracle-passing peer per case, and appends the notes file."""
    runs = sorted(Path("results/nvidia-h200").glob("2026-12-04-f63c5edcc0a8-seed*.jsonl"))
    assert len(runs) >= 2
    notes = tmp_path / "notes.md"
    notes.write_text("## hand-written notes\n")
    page = tmp_path / "page.md"
    argv = ["--from", *map(str, runs), "--markdown", str(page), "--notes", str(notes)]
    assert compare_main(argv) == 0
    text = page.read_text()
    assert text.count("## Run ") == len(runs)
    assert "ours against the fastest peer" in text and "geomean ratio" in text
    assert text.rstrip().endswith("## hand-written notes")
    _, _, rows = results.load(H200_SEED_RUN)
    entries = report.versus(rows, "bwd", "device")
    assert entries and all(e["peer"] not in ("triton", "eager") for e in entries)
    for e in entries:  # the fastest peer really is the fastest passing non-eager peer there
        peers = [r["gbps"] for r in rows if r["mode"] == "bwd" and r["timing"] == "device"
                 and r["status"] == "ok" and r.get("oracle_passed") and (r["m"], r["n"], r["dtype"])
                 == (e["m"], e["n"], e["dtype"]) and r["backend"] not in ("triton", "eager")]  # fmt: skip
        assert e["peer_gbps"] == max(peers)


def test_plots_use_the_hidden_size_when_every_shape_has_one_m_times_n():
    """The wide preset holds M*N at 2**26: plotted against M*N its six shapes were one point."""

    def rows(preset):
        return [{"m": m, "n": n} for m, n in shapes.PRESETS[preset][1]]

    assert plots.x_axis(rows("wide")) == ("n", "N (hidden size)")
    assert plots.x_axis(rows("seed")) == ("mn", "M*N elements")
    # narrow's three shapes share M*N = 2**25: N tells more of the nine shapes apart
    assert plots.x_axis(rows("narrow") + rows("odd") + rows("large"))[0] == "n"


def test_a_forward_only_run_is_plotted_without_empty_panels(tmp_path, monkeypatch):
    """A run of one mode and timing (the v11 forward check) gets that one panel, not four."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    made = []
    subplots = plt.subplots

    def recording_subplots(*args, **kwargs):
        fig, axes = subplots(*args, **kwargs)
        made.append(axes)
        return fig, axes

    monkeypatch.setattr(plt, "subplots", recording_subplots)
    rows = [{"backend": b, "op": "rmsnorm", "m": m, "n": 4096, "dtype": "bf16", "mode": "fwd",
             "timing": "device", "status": "ok", "gbps": g, "oracle_passed": True}
            for b, g in (("triton", 3000.0), ("quack", 2900.0)) for m in (512, 1024)]  # fmt: skip
    path = tmp_path / "plot.png"
    plots.plot(rows, str(path))
    assert path.stat().st_size > 0
    (axes,) = made
    assert axes.shape == (1, 1) and axes[0][0].get_title().startswith("fwd, device-only")
    assert len(axes[0][0].get_lines()) == 2  # one line a backend


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="host overhead: CUDA only")
def test_overhead_reports_host_microseconds_per_call(capsys):
    """python -m harness.overhead: a row per backend and mode, with host and device times, and
    our kernel's cost split (launcher alone, under no_grad)."""
    from harness.overhead import main as overhead_main

    assert overhead_main(["--backends", "triton", "eager", "--calls", "200"]) == 0
    out = capsys.readouterr().out
    assert "host us/call" in out and "triton (launcher only)" in out and "eager" in out


def test_launch_table_shows_a_failed_record_as_text():
    """A backend whose launch record failed keeps its row; the page prints the error."""
    from harness.report import launch_table

    row = {"backend": "triton", "op": "rmsnorm", "dtype": "bf16", "n": 4, "m": 2, "mode": "fwd",
           "timing": "host", "status": "ok", "launch": {"error": "RuntimeError: boom"}}  # fmt: skip
    assert "error: RuntimeError: boom" in launch_table([row])
