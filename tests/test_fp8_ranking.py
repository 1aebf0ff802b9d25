"""harness.fp8_ranking: rmsnorm_fp8 ranked beside its peers from fp8_bench's rows, and
fp8_bench --from, which prints that ranking for a stored run."""

from __future__ import annotations

import json

import pytest

from harness import fp8_ranking
from harness.fp8_bench import main


def _row(backend, case, shape, mode, ms, passed=True, nbytes=1000, gbps=1.0):
    return {"backend": backend, "case": case, "shape": shape, "mode": mode, "status": "ok",
            "ms": ms, "oracle_passed": passed, "bytes": nbytes, "gbps": gbps}  # fmt: skip


def _plain(backend, shape, ms, gbps=1.0):
    return {"case": "plain", "backend": backend, "shape": shape, "mode": "fwd", "status": "ok",
            "ms": ms, "gbps": gbps}  # fmt: skip


def _done(shape):
    return {"case": "shape-done", "status": "info", "shape": shape}


def _line(rows, case, mode):
    (line,) = [d for d in fp8_ranking.rank(rows) if (d["case"], d["mode"]) == (case, mode)]
    return line


def test_ahead_counts_only_peers_that_pass_the_oracle():
    rows = [
        _row("triton-fp8", "per_tensor", "8x256", "fwd", 2.0),
        _row("flashinfer-fp8-static", "per_tensor", "8x256", "fwd", 1.0, passed=False),
        _row("compile-fp8", "per_tensor", "8x256", "fwd", 3.0),
        _row("triton-fp8", "per_tensor", "16x256", "fwd", 2.0),
        _row("compile-fp8", "per_tensor", "16x256", "fwd", 1.0),
        _done("8x256"),
        _done("16x256"),
    ]
    line = _line(rows, "per_tensor", "fwd")
    assert (line["shapes"], line["ahead"]) == (2, 1)
    assert sorted(line["peer_ratios"]) == [(0.5, "16x256", "compile-fp8"),
                                           (1.5, "8x256", "compile-fp8")]  # fmt: skip
    assert dict(line["failing_peers"]) == {"flashinfer-fp8-static": 1}
    text = fp8_ranking.table(rows)
    assert "| per_tensor | fwd | 2 | 1 of 2 | 0.866, 0.500 (16x256, compile-fp8) |" in text
    assert "flashinfer-fp8-static, per_tensor fwd: failed the oracle at 1 of 2" in text


def test_our_own_failure_is_shown():
    rows = [_row("triton-fp8", "block", "8x256", "bwd", 2.0, passed=False), _done("8x256")]
    assert "ours FAILED the oracle at 1" in fp8_ranking.table(rows)


def test_the_plain_forward_bar_takes_the_residual_form_where_the_case_has_one():
    rows = [
        _plain("triton", "8x256", 1.0),
        _plain("triton-add", "8x256", 2.0),
        _row("triton-fp8", "per_token", "8x256", "fwd", 1.05),
        _row("triton-fp8", "block+res", "8x256", "fwd", 2.4),
        _done("8x256"),
    ]
    assert _line(rows, "per_token", "fwd")["plain_ratios"] == [(1.05, "8x256")]
    res = _line(rows, "block+res", "fwd")
    assert res["plain_ratios"] == [(1.2, "8x256")] and not res["plain_without_residual"]
    older = [r for r in rows if r.get("backend") != "triton-add"]  # a run before the add's bar
    res = _line(older, "block+res", "fwd")
    assert res["plain_ratios"] == [(2.4, "8x256")] and res["plain_without_residual"]
    assert "(against the plain forward without a residual)" in fp8_ranking.table(older)


def test_the_copy_target_counts_shapes_of_64_mib_and_more():
    big, small = 64 << 20, (64 << 20) - 1
    rows = [
        _plain("copy", "8x256", 1.0, gbps=100.0),
        _plain("copy", "16x256", 1.0, gbps=100.0),
        _row("triton-fp8", "per_token", "8x256", "fwd", 1.0, nbytes=big, gbps=90.0),
        _row("triton-fp8", "per_token", "16x256", "fwd", 1.0, nbytes=big, gbps=89.0),
        _row("triton-fp8", "per_token", "32x256", "fwd", 1.0, nbytes=small, gbps=1.0),
        _plain("copy", "32x256", 1.0, gbps=100.0),
        _done("8x256"),
        _done("16x256"),
        _done("32x256"),
    ]
    line = _line(rows, "per_token", "fwd")
    assert (line["big"], line["big_met"]) == (2, 1)


def test_a_shape_cut_short_is_left_out():
    rows = [
        _row("triton-fp8", "per_token", "8x256", "fwd", 1.0),
        _row("triton-fp8", "per_token", "16x256", "fwd", 1.0),  # no shape-done: cut
        _done("8x256"),
    ]
    assert _line(rows, "per_token", "fwd")["shapes"] == 1


def test_bench_from_prints_the_ranking_of_a_stored_run(tmp_path, capsys):
    out = tmp_path / "fp8.jsonl"
    rows = [{"case": "provenance", "status": "info", "commit": "0123456789ab", "gpu": "X"},
            _row("triton-fp8", "per_token", "8x256", "fwd", 1.0), _done("8x256")]  # fmt: skip
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["--from", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "commit 0123456789ab" in printed and "| per_token | fwd | 1 | 1 of 1 |" in printed
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(_done("8x256")) + "\n")
    with pytest.raises(SystemExit):
        main(["--from", str(bad)])


def test_the_without_residual_note_survives_a_later_shape_without_plain_rows():
    rows = [
        _plain("triton", "8x256", 1.0),  # a run before the add's bar: no triton-add row
        _row("triton-fp8", "block+res", "8x256", "fwd", 2.4),
        _row("triton-fp8", "block+res", "16x256", "fwd", 2.4),  # its plain rows failed
        _done("8x256"),
        _done("16x256"),
    ]
    line = _line(rows, "block+res", "fwd")
    assert line["plain_ratios"] == [(2.4, "8x256")] and line["plain_without_residual"]
