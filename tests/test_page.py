"""The results page is generated from the index of current runs (harness.page)."""

import os
from pathlib import Path

import pytest

from harness import page
from harness.index import read_index

ROOT = Path(__file__).resolve().parent.parent
INDEX = ROOT / "results" / "nvidia-h200" / "INDEX.md"


def test_index_names_existing_files_and_the_pages_are_current(monkeypatch):
    """The results page and every run's page are what harness.page writes from the index
    (stale: regenerate), the results page stays under 40 KB, links each run's page, and no
    run page is left for a run the index no longer lists."""
    monkeypatch.chdir(ROOT)  # the page names the command that made it, with relative paths
    entries = read_index(INDEX)
    assert {e["run"] for e in entries} >= {
        "seed",
        "seed-fp32",
        "add",
        "narrow-odd-large",
        "overhead",
    }
    out = Path("results/README.md")
    pages = page.build_pages(INDEX.relative_to(ROOT), out, make_plots=False)
    text = pages[out]
    assert len(text.encode()) <= 40_000, "results page over 40 KB: trim it or split the index"
    listed = pages[INDEX.parent.relative_to(ROOT) / "runs" / page.LISTED_PAGE]
    for e in entries:
        assert e["file"] in text or e["file"] in listed, e["run"]
        assert not (e["file"] in text and e["file"] in listed), e["run"]
    assert "**In short**" in text
    fix = "run python -m harness.page " + str(INDEX.relative_to(ROOT))
    for path, expected in pages.items():
        committed = (ROOT / path).read_text(encoding="utf-8")
        assert committed == expected, f"{path} is stale: {fix}"
        if path != out:
            assert os.path.relpath(path, out.parent) in text  # linked from the results page
    run_pages = {p.relative_to(ROOT) for p in (INDEX.parent / "runs").glob("*.md")}
    assert run_pages == set(pages) - {out}, f"run pages of runs no longer listed: {fix}"


def test_index_errors_name_the_problem(tmp_path):
    bad = tmp_path / "INDEX.md"
    bad.write_text("| run | file |\n|---|---|\n| seed | x.jsonl |\n", encoding="utf-8")
    with pytest.raises(ValueError, match="lacks column"):
        read_index(bad)
    bad.write_text("| run | file | plot | what |\n|---|---|---|---|\n| seed | x.jsonl | - | s |\n")
    with pytest.raises(ValueError, match="does not exist"):
        read_index(bad)


def test_probes_and_logs_get_a_page_of_their_own_numbered_with_the_runs(tmp_path):
    """An index line whose file has no section (a log, a probe's JSON) is listed on the page of
    probes and logs, under its index number, not on the results page; a run may not take that
    page's name."""
    (tmp_path / "a.log").write_text("log\n")
    (tmp_path / "b.log").write_text("log\n")
    index = tmp_path / "INDEX.md"
    index.write_text("| run | file | plot | what |\n|---|---|---|---|\n"
                     "| tests | a.log | - | the tests |\n| more | b.log | - | more tests |\n")  # fmt: skip
    out = tmp_path / "README.md"
    pages = page.build_pages(index, out, make_plots=False)
    listed = pages[tmp_path / "runs" / page.LISTED_PAGE]
    assert "| 1 | tests | [a.log](../a.log) | the tests |" in listed
    assert "| 2 | more | [b.log](../b.log) | more tests |" in listed
    assert "a.log" not in pages[out] and "runs/probes-and-logs.md" in pages[out]
    index.write_text("| run | file | plot | what |\n|---|---|---|---|\n"
                     "| probes-and-logs | a.log | - | clash |\n")  # fmt: skip
    with pytest.raises(ValueError, match="may not be named"):
        page.build_pages(index, out, make_plots=False)


def test_in_short_stops_at_the_next_block(tmp_path):
    targets = tmp_path / "targets.md"
    targets.write_text("# t\n\n**In short** a\n1. b\n\n**What each run** c\n| x |\n")
    assert page.in_short(targets) == "**In short** a\n1. b"


def _cost_row(backend, mode, **fields):
    return {"backend": backend, "op": "rmsnorm", "mode": mode, "shape": "16x4096",
            "dtype": "bf16", "timing": "device", **fields}  # fmt: skip


def test_costs_table_shows_what_was_measured_and_drops_the_rest():
    rows = [
        _cost_row("triton", "fwd", host_us=44.7, batch_invariant=True),
        _cost_row("triton", "bwd", host_us=126.1, batch_invariant=False, batch_diff=11),
        _cost_row("torch", "fwd", host_us=20.7, batch_invariant=True),
        _cost_row("vllm", "fwd"),  # not installed: no cost fields
    ]
    text = page.costs_table(rows, "rmsnorm")
    lines = text.splitlines()
    assert lines[0] == ("| backend | fwd host us | bwd host us | fwd batch-invariant "
                        "| bwd batch-invariant |")  # fmt: skip
    assert "| triton | 44.7 | 126.1 | yes | no |" in lines
    assert "| torch | 20.7 | - | yes | - |" in lines
    assert not any("vllm" in line for line in lines)  # nothing measured: no line
    assert "first s" not in text  # no first-call columns were measured
    assert page.costs_table([_cost_row("torch", "fwd")], "rmsnorm") == ""


def test_json_tables_tell_a_host_cost_grid_an_overhead_record_and_a_probe_apart(tmp_path):
    import json

    grid = tmp_path / "host-cost.json"
    row = {"dtype": "bf16", "m": 64, "n": 4096, "mode": "nograd", "ours_us": 30.0,
           "torch_us": 20.0, "ratio": 1.5, "met": False}  # fmt: skip
    cpp = {**row, "host_path": "cpp", "ours_us": 15.0, "ratio": 0.75, "met": True}
    grid.write_text(json.dumps({"bars": {"nograd": 1.0}, "rows": [row, cpp], "summary": "| s |"}))
    (table,) = page.json_tables(grid)
    assert "| s |" in table
    assert (
        "| bf16 | 64x4096 | nograd | python | 30.0 | 20.0 | 1.50 | no |" in table
    )  # (older files)
    assert "| bf16 | 64x4096 | nograd | cpp | 15.0 | 20.0 | 0.75 | yes |" in table
    overhead = tmp_path / "overhead.json"
    overhead.write_text(json.dumps({"shape": [512, 2048], "dtype": "bf16",
                                    "rows": [{"backend": "triton", "mode": "fwd"}]}))  # fmt: skip
    (table,) = page.json_tables(overhead)
    assert "Host overhead at 512x2048 bf16" in table and "| triton | fwd |" in table
    ncu = tmp_path / "ncu-bytes.json"
    record = {"backend": "triton", "shape": "4096x4096", "dtype": "bf16", "mode": "fwd",
              "op": "rmsnorm", "model_bytes": 67108864, "dram_read_bytes": 33572096.0,
              "dram_write_bytes": 8879616.0, "kernels": 1, "ratio": 0.63}  # fmt: skip
    ncu.write_text(json.dumps({"provenance": {}, "records": [record]}))
    (table,) = page.json_tables(ncu)
    assert "Writes are a floor" in table
    # reads 33.57 MB against the model's 33.55 (x): 1.00; writes 8.88 of 33.55 reached DRAM
    assert (
        "| triton | 4096x4096 | bf16 | fwd | 1 | 33.57 | 33.55 | 1.00 | 8.88 | 33.55 | 0.63 |"
        in table
    )
    first = tmp_path / "first-call.json"
    first.write_text(json.dumps({"rows": [{"m": 8, "n": 7168, "dtype": "bfloat16",
        "backend": "ours", "cache": "cold", "process_first_s": 3.466, "first_s": 0.654,
        "steady_s": 0.000419, "first_extra_bytes": 2**20,
        "steady_extra_bytes": 2**20}]}))  # fmt: skip
    (table,) = page.json_tables(first)
    assert "| 8x7168 | bfloat16 | ours | cold | 3.47 | 0.654 | 0.419 | 1.0 | 1.0 |" in table
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"gpu": "x", "rows": [{"shape": [1, 2]}]}))
    assert page.json_tables(probe) is None


def test_run_pages_plot_bandwidth_against_n_where_the_widths_vary(tmp_path):
    """A run of three widths or more gets a bandwidth-against-N plot beside its file; one of
    fewer gets none; no first-call plot without first-call costs."""
    pytest.importorskip("matplotlib")
    rows = [{"backend": "triton", "op": "rmsnorm", "mode": "fwd", "timing": "device",
             "status": "ok", "oracle_passed": True, "m": 64, "n": n, "gbps": 100.0 + n / 64}
            for n in (1024, 2048, 4096)]  # fmt: skip
    run = tmp_path / "run.jsonl"
    ((title, plot),) = page._run_plots(run, rows, make_plots=True)
    assert title == "bandwidth against N" and plot == tmp_path / "bandwidth-vs-n-run.png"
    assert plot.stat().st_size > 0
    assert page._run_plots(tmp_path / "two.jsonl", rows[:2], make_plots=True) == []
    assert page._run_plots(tmp_path / "new.jsonl", rows, make_plots=False) == []  # not drawn


def test_a_preview_elsewhere_leaves_the_index_pages_alone(tmp_path):
    """--out outside the index's tree: the run pages go under the preview's folder (named for
    the index's folder), never to runs/ beside the index, and none there is deleted."""
    data = tmp_path / "results" / "gpu"
    data.mkdir(parents=True)
    (data / "a.log").write_text("log\n")
    index = data / "INDEX.md"
    index.write_text("| run | file | plot | what |\n|---|---|---|---|\n| tests | a.log | - | t |\n")
    committed = data / "runs" / "old-run.md"
    committed.parent.mkdir()
    committed.write_text("a committed page\n")
    preview = tmp_path / "preview" / "page.md"
    assert page.main([str(index), "--out", str(preview), "--no-plots"]) == 0
    assert (tmp_path / "preview" / "gpu" / "runs" / page.LISTED_PAGE).is_file()
    assert sorted(p.name for p in (data / "runs").iterdir()) == ["old-run.md"]
    assert page.runs_folder(index, tmp_path / "results" / "README.md") == data / "runs"
    assert page.runs_folder(index, data / "README.md") == data / "runs"
