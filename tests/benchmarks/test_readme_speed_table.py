"""README.md's speed tables are the ones benchmarks/readme_table.py renders
from the current report of each GPU."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("readme_table", ROOT / "benchmarks" / "readme_table.py")
readme_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme_table)


def test_readme_tables_are_generated_from_the_reports():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for gpu in readme_table.REPORTS:
        assert (ROOT / readme_table.REPORTS[gpu]).is_file()
        assert readme_table.render(gpu, readme_table.load(gpu)) in text, (
            f"README's {gpu} speed table is stale: run python benchmarks/readme_table.py")
    assert readme_table.update(ROOT / "README.md", check=True)


def test_a_cell_is_the_range_of_the_ratios():
    """One head-dim-128 long-S forward cell, computed here from the report's
    TFLOP/s, against the rendered table."""
    report = readme_table.load("h100")
    rows = [r for r in report["rows"] if r["shape"]["label"] == "standard"
            and r["shape"]["head_dim"] == 128 and r["shape"]["seqlen_q"] >= 2048]
    assert len(rows) >= 4  # fp16 and bf16, causal and not, several lengths
    flash = [r["tflops"]["fwd"]["aotriton-rocm"] / r["tflops"]["fwd"]["FLASH"] for r in rows]
    cudnn = [r["tflops"]["fwd"]["aotriton-rocm"] / r["tflops"]["fwd"]["CUDNN"] for r in rows]
    want = f"{min(flash):.2f}-{max(flash):.2f} / {min(cudnn):.2f}-{max(cudnn):.2f}"
    table = readme_table.render("h100", report)
    line = next(l for l in table.splitlines() if l.startswith("| 128 |"))
    assert line.split(" | ")[2] == want  # head dim | fwd S <= 1k | fwd S >= 2k | ...


def test_update_rewrites_a_stale_table(tmp_path):
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    report = {"meta": {"gpu": "GPU X", "torch": "2.11"}, "rows": [
        {"shape": {"label": "standard", "head_dim": 64, "seqlen_q": s, "causal": False, "dtype": "fp16"},
         "tflops": {"fwd": {"aotriton-rocm": 100.0, "FLASH": f, "CUDNN": 200.0},
                    "bwd": {"aotriton-rocm": 50.0, "FLASH": 40.0, "CUDNN": 0}}}
        for s, f in ((512, 80.0), (1024, 50.0), (4096, 100.0))]}
    (tmp_path / readme_table.REPORTS["h100"]).write_text(json.dumps(report), encoding="utf-8")
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{readme_table.begin_marker('h100')}\nold\n{readme_table.end_marker('h100')}\nafter\n",
                      encoding="utf-8")
    assert not readme_table.update(readme, tmp_path, check=True)
    assert not readme_table.update(readme, tmp_path)
    text = readme.read_text(encoding="utf-8")
    assert text.startswith("intro\n") and text.endswith("after\n") and "old" not in text
    # S <= 1k: 100/80 and 100/50; S >= 2k: 100/100; cuDNN 0.5 everywhere; a zero peer gives no figure
    assert "| 64 | 1.25-2.00 / 0.50 | 1.00 / 0.50 | 1.25 / - | 1.25 / - |" in text
    assert readme_table.update(readme, tmp_path, check=True)
