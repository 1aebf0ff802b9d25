"""The command lines a new user meets first: harness.compare and harness.overhead.

Every bad option ends in argparse's error (exit 2, the usage line, what was expected), never a
traceback; without CUDA, compare is a correctness run; results go where asked, a run that did
not finish says so when read back. Cheap cases only: tiny shapes, one or two backends.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from harness import compare, interpreter, overhead, pace, results
from harness.compare import main as compare_main
from harness.index import folder_runs, read_index
from harness.shapes import PRESETS
from impls import all_backends

ON_GPU = torch.cuda.is_available()


def _usage_error(capsys, argv, *expected, main=compare_main) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert err.startswith("usage: python -m harness.")
    assert "Traceback" not in err
    for text in expected:
        assert text in err, err
    return err


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--preset", "sead"], ["argument --preset", "invalid choice: 'sead'", "'seed'", "'cpu'"]),
        (["--backends", "tritonn"], ["argument --backends", "invalid choice: 'tritonn'",
                                     "'triton'", "'eager'"]),
        (["--shape", "64by512"], ["argument --shape", "expected MxN such as 4096x8192"]),
        (["--shape", "0x512"], ["argument --shape", "must be positive"]),
        (["--dtypes", "fp8"], ["argument --dtypes", "invalid choice: 'fp8'", "'bf16'"]),
        (["--timing", "check", "host"], ["argument --timing", "runs alone"]),
        (["--notes", "no/such/notes.md"], ["argument --notes", "no such file"]),
    ],
    ids=["preset", "backends", "shape", "shape-zero", "dtypes", "timing-mix", "notes"],
)  # fmt: skip
def test_compare_bad_options_are_usage_errors(capsys, argv, expected):
    _usage_error(capsys, argv, *expected)


def test_compare_from_a_missing_file_an_empty_directory_or_not_results(capsys, tmp_path):
    _usage_error(capsys, ["--from", str(tmp_path / "nope.jsonl")], "argument --from",
                 "no such file or directory")  # fmt: skip
    _usage_error(capsys, ["--from", str(tmp_path)], "argument --from", "without results files")
    text = tmp_path / "notes.jsonl"
    text.write_text("this is not JSON\n")
    _usage_error(capsys, ["--from", str(text)], "argument --from", "not a results file")
    other = tmp_path / "overhead.json"  # JSON, but harness.overhead's, not results
    other.write_text(json.dumps({"provenance": {}, "rows": []}, indent=1))
    _usage_error(
        capsys, ["--from", str(other)], "neither results (JSON lines) nor pytest-benchmark"
    )
    _usage_error(capsys, ["--out", f"{text}/sub/r.jsonl"], "argument --out", "cannot make")
    _usage_error(capsys, ["--from", str(text), "--backends", "eager"],
                 "--backends only apply when measuring")  # fmt: skip


@pytest.mark.skipif(ON_GPU, reason="without CUDA only")
def test_compare_without_cuda_refuses_timings(capsys):
    _usage_error(capsys, ["--timing", "host"], "host timing needs CUDA", "--from")
    _usage_error(capsys, ["--plot", "p.png"], "argument --plot", "no bandwidth")


def test_compare_help_lists_backends_presets_and_what_needs_cuda(capsys):
    with pytest.raises(SystemExit) as exit_info:
        compare_main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for name in (b.name for b in all_backends(None)):  # rmsnorm_fp8's: harness.fp8_bench
        assert f"\n  {name} " in out
    for name in PRESETS:
        assert f"\n  {name}: " in out
    assert "device  CUDA-graph replay" in out and "needs CUDA" in out
    assert f"--from {compare.H200_RESULTS}" in out


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_correctness_run_writes_where_asked_and_reads_back(capsys, tmp_path):
    """--timing check (the default without CUDA): oracle verdicts, no timings, no ranking; the
    file ends with its "complete" record; --from a file or its directory shows the same table,
    and says INCOMPLETE once the record is gone."""
    argv = ["--backends", "triton", "eager", "--shape", "16x256", "--dtypes", "bf16",
            "--timing", "check", "--out", f"{tmp_path}/new/"]  # fmt: skip
    assert compare_main(argv) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "2 steps (2 backends x 1 shapes x 1 dtypes)" in captured.err
    assert ("CORRECTNESS RUN (no CUDA device)" in out) == (not ON_GPU)
    assert "oracle check, no timing" in out and "GB/s" not in out and "x eager" not in out
    assert "| triton " in out and "| eager " in out and "FAIL" not in out
    (path,) = (tmp_path / "new").glob("*.jsonl")
    assert f"rows written to {path}" in out
    records = _records(path)
    assert records[0]["kind"] == "provenance" and records[0]["format"] == results.FORMAT
    rows = [r for r in records if r["kind"] == "row"]
    assert records[-1] == {"kind": "complete", "rows": len(rows)} and len(rows) == 4
    assert all(r["timing"] == "check" and r["status"] == "checked" for r in rows)
    assert all(r["oracle_passed"] and "ms" not in r for r in rows)
    # our rows record the launch configurations the check ran
    launch = next(r["launch"] for r in rows if r["backend"] == "triton")
    assert {"rmsnorm_fwd_kernel", "rmsnorm_bwd_kernel"} <= set(launch)

    for source in (path, path.parent):  # a file, or the directory holding it
        assert compare_main(["--from", str(source)]) == 0
        again = capsys.readouterr().out
        assert "| triton " in again and "INCOMPLETE" not in again
    path.write_text("".join(line + "\n" for line in path.read_text().splitlines()[:-2]))
    assert compare_main(["--from", str(path)]) == 0
    assert "INCOMPLETE" in capsys.readouterr().out
    _usage_error(capsys, ["--from", str(path), "--markdown", str(tmp_path / "p.md")],
                 "argument --markdown", "correctness run")  # fmt: skip


def test_default_output_leaves_the_working_directory_alone(capsys, tmp_path, monkeypatch):
    root = tmp_path / "store"
    monkeypatch.setenv("RMSNORM_BENCH_RESULTS", str(root))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    argv = ["--backends", "eager", "--shape", "8x64", "--dtypes", "fp32", "--modes", "fwd",
            "--timing", "check"]  # fmt: skip
    assert compare_main(argv) == 0
    assert list(work.iterdir()) == []
    (path,) = root.glob("*/*.jsonl")
    assert path.parent.name == results.gpu_slug(
        {"gpu": torch.cuda.get_device_name()} if ON_GPU else {}
    )
    assert f"rows written to {path}" in capsys.readouterr().out


def test_an_interrupted_run_is_marked_and_named_incomplete(capsys, tmp_path, monkeypatch):
    import harness.run

    def interrupted(config, sink, progress=None):
        sink({"backend": "eager", "label": "eager", "op": "rmsnorm", "m": 8, "n": 64,
              "shape": "8x64", "dtype": "fp32", "mode": "fwd", "timing": "check",
              "status": "checked", "reason": None, "oracle_passed": True})  # fmt: skip
        raise KeyboardInterrupt

    monkeypatch.setattr(harness.run, "run", interrupted)
    out = tmp_path / "partial.jsonl"
    argv = ["--backends", "eager", "--shape", "8x64", "--timing", "check", "--out", str(out)]
    assert compare_main(argv) == 130
    assert "INTERRUPTED: 1 rows written" in capsys.readouterr().err
    assert [r["kind"] for r in _records(out)] == ["provenance", "ceiling", "row"]
    provenance, _, rows = results.load(out)
    assert provenance["complete"] is False and len(rows) == 1
    assert compare_main(["--from", str(out)]) == 0
    assert "INCOMPLETE: " in capsys.readouterr().out


def test_a_run_cut_short_is_resumed_in_its_own_file(capsys, tmp_path, monkeypatch):
    """--resume: the cases the cut run finished are kept, the one cut mid-way is dropped and
    measured again whole, the rest are measured, in the same file, which ends complete with
    every case's rows once; options cannot be changed, a complete run or another commit's is
    refused."""
    import harness.run

    real_run = harness.run.run
    argv = ["--backends", "eager", "eager-fp32", "--shape", "8x64", "16x64", "8x128",
            "--dtypes", "fp32", "bf16", "--timing", "check"]  # fmt: skip

    def cut_after(k):
        def run(config, sink, progress=lambda msg: None):
            count = [0]

            def counting(row):
                if count[0] == k:
                    raise KeyboardInterrupt
                count[0] += 1
                sink(row)

            real_run(config, counting, progress)

        return run

    out = tmp_path / "cut.jsonl"
    monkeypatch.setattr(harness.run, "run", cut_after(6))  # 4 rows a case: 1 case and a half
    assert compare_main([*argv, "--out", str(out)]) == 130
    monkeypatch.setattr(harness.run, "run", real_run)
    capsys.readouterr()
    # a process killed inside a write leaves its last row in part, without a newline: that
    # line is left out (and named); a line not JSON anywhere else is still an error
    text = out.read_text()
    out.write_text(text + text.splitlines()[-1][:40])
    provenance, _, cut_rows = results.load(out)
    assert provenance["cut_line"] == len(text.splitlines()) + 1 and len(cut_rows) == 6
    broken = tmp_path / "broken.jsonl"
    broken.write_text(text.replace("\n", "\n{oops\n", 1))
    with pytest.raises(ValueError, match="broken.jsonl:2: not a JSON record"):
        results.load(broken)
    _usage_error(capsys, ["--resume", str(out), "--backends", "eager"], "argument --resume",
                 "--backends cannot change them")  # fmt: skip
    assert compare_main(["--resume", str(out)]) == 0
    err = capsys.readouterr().err
    assert "1 cases kept, 5 to measure" in err and "written in part" in err
    provenance, _, rows = results.load(out)
    assert provenance["complete"] is True and len(provenance["resumed"]) == 1
    assert "cut_line" not in provenance and "cut_line" not in out.read_text()
    keys = [(r["backend"], r["shape"], r["dtype"], r["mode"]) for r in rows]
    assert len(keys) == len(set(keys)) == 24  # 2 backends x 3 shapes x 2 dtypes x 2 modes
    assert all(r["oracle_passed"] for r in rows)
    _usage_error(capsys, ["--resume", str(out)], "argument --resume", "is complete")

    other = tmp_path / "other.jsonl"
    records = [json.loads(line) for line in out.read_text().splitlines()[:-1]]
    records[0]["commit"] = "0123456789ab"
    other.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(SystemExit, match="not the same run .*commit '0123456789ab' there"):
        compare_main(["--resume", str(other)])


def test_files_from_before_completion_records_are_not_called_incomplete():
    from tests.test_harness import H200_LEGACY_RUN

    provenance, _, _ = results.load(H200_LEGACY_RUN)
    assert provenance["complete"] is None


def test_pytest_benchmark_json_names_its_versions_or_says_none_were_recorded(capsys, tmp_path):
    bench = {"backend": "eager", "label": "eager", "m": 8, "n": 64, "shape": "8x64",
             "dtype": "bf16", "mode": "fwd", "bytes": 2048, "gpu": None, "oracle_passed": True,
             "oracle_max_ulps": 1.0}  # fmt: skip
    for extra, expected in (({"torch": "2.13.0", "triton": "3.9.0"}, "torch 2.13.0 | triton 3.9.0"),
                            ({}, "versions not recorded")):  # fmt: skip
        path = tmp_path / "bench.json"
        stats = {"median": 1e-5, "q1": 1e-5, "q3": 1e-5}
        path.write_text(json.dumps({"benchmarks": [{"extra_info": {**bench, **extra},
                                                    "stats": stats}]}))  # fmt: skip
        assert compare_main(["--from", str(path)]) == 0
        out = capsys.readouterr().out
        assert expected in out and "None" not in out.split("\n## ")[0]


def test_estimate_counts_steps_and_gives_a_rough_time():
    from impls import all_backends, get_backend

    backends = all_backends("rmsnorm")
    text = pace.estimate([(64, 512), (128, 1000)], 2, backends, ["check"], None)
    assert text.startswith(
        f"{4 * len(backends)} steps ({len(backends)} backends x 2 shapes x 2 dtypes), roughly "
    )
    small = pace.estimate([(64, 512)], 1, [get_backend("eager")], ["check"], None)
    large = pace.estimate([(4096, 8192), (8192, 8192)], 1, [get_backend("eager")], ["check"], None)
    assert "roughly 1 s here" in small and " min here" in large
    unknown = pace.estimate([(512, 2048)], 1, backends[:1], ["device"], "A GPU never measured")
    assert "no earlier run on this GPU records its pace" in unknown


def test_the_estimate_takes_its_pace_from_the_runs_the_gpu_index_lists(capsys, tmp_path):
    """A run's rows record elapsed_s (seconds since it started); an estimate on that GPU takes
    its pace from the newest complete run that records it, among the runs results/<gpu>/INDEX.md
    lists and the folder's *.jsonl, newest by start time; an interrupted run only when no
    complete one has it. Runs without elapsed_s (those committed before rows had it) give none."""
    from tests.test_harness import H200_LEGACY_RUN

    folder = tmp_path / results.gpu_slug({"gpu": "NVIDIA H200"})
    name = "2026-12-02-0123456789ab-decode.jsonl"
    argv = ["--backends", "eager", "--shape", "8x64", "16x64", "--dtypes", "fp32", "--modes",
            "fwd", "--timing", "check", "--out", str(folder / "runs" / name)]  # fmt: skip
    assert compare_main(argv) == 0
    capsys.readouterr()
    _, _, rows = results.load(folder / "runs" / name)
    elapsed = [r["elapsed_s"] for r in rows]
    assert len(rows) == 2 and all(e >= 0 for e in elapsed)

    lines = H200_LEGACY_RUN.read_text().splitlines()
    committed = folder / "2026-12-03-0123456789ab-seed.jsonl"  # complete, no elapsed_s
    committed.write_text("\n".join(lines) + "\n")
    unfinished = folder / "2026-12-04-0123456789ab-wide.jsonl"  # elapsed_s, never completed
    paced = [json.dumps({**json.loads(line), "elapsed_s": 1.0}) for line in lines[2:5]]  # 1 step
    unfinished.write_text("\n".join([*lines[:2], *paced]) + "\n")
    older = folder / "2026-12-02-ffffffffffff-older.jsonl"  # sorts after `name`, started before
    older.write_text("\n".join([json.dumps({**json.loads(lines[0]), "date": "2020-01-01"}),
                                 *paced, json.dumps({"kind": "complete", "rows": 3})]) + "\n")  # fmt: skip
    index = folder / "INDEX.md"
    index.write_text(f"| run | file | plot | what |\n|---|---|---|---|\n"
                     f"| decode | runs/{name} | - | a run kept in a subfolder |\n"
                     f"| seed | {committed.name} | - | from before rows had elapsed_s |\n")  # fmt: skip

    assert pace.recorded_pace("NVIDIA H200", root=tmp_path) == (max(elapsed) / 2, name)
    index.unlink()  # the folder alone: runs/ is not in it, so the older run is the newest
    assert pace.recorded_pace("NVIDIA H200", root=tmp_path) == (1.0, older.name)
    older.unlink()  # no complete run with elapsed_s left: the interrupted one, named so
    assert pace.recorded_pace("NVIDIA H200", root=tmp_path) == (
        1.0,
        f"{unfinished.name}, an interrupted run",
    )
    unfinished.unlink()  # only the run from before rows had elapsed_s
    assert pace.recorded_pace("NVIDIA H200", root=tmp_path) is None
    assert pace.recorded_pace("A GPU never measured", root=tmp_path) is None

    # the committed index parses, and every run it lists is a source
    h200 = H200_LEGACY_RUN.parent
    listed = {row["path"].name for row in read_index(h200 / "INDEX.md")}
    assert {p.name for p in folder_runs(h200)} >= {n for n in listed
                                                              if n.endswith(".jsonl")}  # fmt: skip


def test_triton_before_3_7_with_numpy_2_4_is_named_with_its_fix():
    assert "triton>=3.7" in interpreter.interpreter_problem((3, 6), (2, 4))
    assert interpreter.interpreter_problem((3, 7), (2, 4)) is None
    assert interpreter.interpreter_problem((3, 6), (2, 3)) is None


@pytest.mark.skipif(ON_GPU, reason="the interpreter runs without CUDA only")
def test_compare_names_the_fix_for_an_interpreter_that_cannot_run(capsys, monkeypatch):
    releases = {"triton": (3, 6), "numpy": (2, 4)}
    monkeypatch.setattr(interpreter, "_release", releases.get)
    _usage_error(capsys, ["--backends", "eager", "--shape", "8x64"], "triton 3.6 with numpy 2.4",
                 "'triton>=3.7'")  # fmt: skip
    with pytest.raises(RuntimeError, match="triton>=3.7"):
        interpreter.use_interpreter_without_cuda()


def test_overhead_bad_options_are_usage_errors(capsys):
    _usage_error(capsys, ["--shape", "64by512"], "argument --shape", "expected MxN",
                 main=overhead.main)  # fmt: skip
    _usage_error(capsys, ["--calls", "0"], "argument --calls", "positive", main=overhead.main)
    _usage_error(capsys, ["--backends", "tritonn"], "invalid choice", main=overhead.main)


@pytest.mark.skipif(ON_GPU, reason="without CUDA only")
def test_overhead_without_cuda_is_a_one_line_error(capsys):
    assert overhead.main([]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs a CUDA GPU" in err


def test_plot_options_without_matplotlib_fail_before_anything_runs(monkeypatch, capsys, tmp_path):
    """--plot (and --plot-n, --plot-first-call) without matplotlib: a usage error naming the
    option and the install command, before a run is measured or ranked, not an ImportError at
    its end; harness.page the same, unless --no-plots."""
    import sys

    from harness import page
    from tests.test_harness import H200_SEED_RUN

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    for option in ("--plot", "--plot-n", "--plot-first-call"):
        with pytest.raises(SystemExit) as exit_info:
            compare_main(["--from", str(H200_SEED_RUN), option, str(tmp_path / "p.png")])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {option}: plots need matplotlib" in err and ".[plots]" in err
        assert not (tmp_path / "p.png").exists()
    with pytest.raises(SystemExit) as exit_info:
        page.main(["results/nvidia-h200/INDEX.md", "--out", str(tmp_path / "README.md")])
    assert exit_info.value.code == 2 and "--no-plots" in capsys.readouterr().err
    assert not (tmp_path / "README.md").exists()
