"""docs/benchmarks.md is written from the benchmarks' last printed lines (``./tasks.sh bench``),
with the machine and its limit; a benchmark not run keeps its row; the committed page is what the
committed data renders."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _writer():
    spec = importlib.util.spec_from_file_location(
        "benchmarks_page", ROOT / "docs" / "tools" / "benchmarks_page.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bench(folder: Path) -> Path:
    folder.mkdir()
    (folder / "bench_a.py").write_text('"""Thing A against thing B, side by side. More."""\n')
    (folder / "bench_b.py").write_text('"""Thing C."""\n')
    return folder


def test_the_last_line_machine_and_limit_go_onto_the_page(tmp_path, monkeypatch):
    writer = _writer()
    monkeypatch.setattr(writer, "limit_gflops", lambda: 123.456)
    monkeypatch.setattr(writer, "machine", lambda: "Test CPU, 2 cores, 24 GiB, no GPU")
    monkeypatch.setattr(writer, "commit", lambda: "abc1234")
    bench = _bench(tmp_path / "bench")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "bench_a.log").write_text("== progress\nnot this line\na: ratio=0.44 same=True\n\n")
    data, page = tmp_path / "b.json", tmp_path / "b.md"
    argv = [str(logs), "--data", str(data), "--page", str(page), "--bench", str(bench)]
    assert writer.main(argv) == 0
    text = page.read_text()
    assert "`a: ratio=0.44 same=True`" in text and "not this line" not in text
    assert "Test CPU, 2 cores, 24 GiB, no GPU | 123.5 GFLOP/s" in text
    assert "Thing A against thing B, side by side." in text and "More" not in text
    assert "| `bench_b.py` | Thing C. | not recorded yet |" in text
    assert json.loads(data.read_text())["bench_a.py"]["commit"] == "abc1234"

    # Only bench_b runs next time: bench_a keeps its line, on its own machine.
    (logs / "bench_a.log").unlink()
    (logs / "bench_b.log").write_text("b: x=1\n")
    monkeypatch.setattr(writer, "machine", lambda: "Other CPU, 8 cores, 64 GiB, no GPU")
    assert writer.main(argv) == 0
    text = page.read_text()
    assert "`a: ratio=0.44 same=True`" in text and "`b: x=1`" in text
    assert "| M1 | Test CPU" in text and "| M2 | Other CPU" in text


def test_the_limit_is_measured():
    assert _writer().limit_gflops(repeats=1) > 0.1


def test_the_committed_page_is_the_committed_data_rendered():
    writer = _writer()
    data = json.loads((ROOT / "docs" / "benchmarks.json").read_text(encoding="utf-8"))
    rendered = writer.render(data, ROOT / "bench")
    committed = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert committed == rendered, "docs/benchmarks.md is edited by hand or stale: ./tasks.sh bench"
    for script, entry in data.items():
        assert (ROOT / "bench" / script).exists(), script
        assert f"`{entry['line']}`" in committed
