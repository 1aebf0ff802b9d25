"""The results page is generated from the index of current runs (harness.page)."""

from pathlib import Path

import pytest

from harness import page

ROOT = Path(__file__).resolve().parent.parent
INDEX = ROOT / "results" / "nvidia-h200" / "INDEX.md"


def test_index_names_existing_files_and_the_page_is_current(monkeypatch):
    monkeypatch.chdir(ROOT)  # the page names the command that made it, with relative paths
    entries = page.read_index(INDEX)
    assert {e["run"] for e in entries} >= {
        "seed",
        "seed-fp32",
        "add",
        "narrow-odd-large",
        "overhead",
    }
    text = page.build_page(INDEX.relative_to(ROOT), Path("results/README.md"), make_plots=False)
    assert len(text.encode()) <= 40_000, "results page over 40 KB: trim it or split the index"
    for e in entries:
        assert e["file"] in text
    assert "**In short**" in text
    committed = (ROOT / "results" / "README.md").read_text(encoding="utf-8")
    assert committed == text, "results/README.md is stale: run python -m harness.page " + str(
        INDEX.relative_to(ROOT)
    )


def test_index_errors_name_the_problem(tmp_path):
    bad = tmp_path / "INDEX.md"
    bad.write_text("| run | file |\n|---|---|\n| seed | x.jsonl |\n", encoding="utf-8")
    with pytest.raises(ValueError, match="lacks column"):
        page.read_index(bad)
    bad.write_text("| run | file | plot | what |\n|---|---|---|---|\n| seed | x.jsonl | - | s |\n")
    with pytest.raises(ValueError, match="does not exist"):
        page.read_index(bad)


def test_in_short_stops_at_the_next_block(tmp_path):
    targets = tmp_path / "targets.md"
    targets.write_text("# t\n\n**In short** a\n1. b\n\n**What each run** c\n| x |\n")
    assert page.in_short(targets) == "**In short** a\n1. b"
