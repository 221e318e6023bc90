"""Every Python code block in the README runs, in order, in a fresh interpreter."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_has_code() -> None:
    assert len(python_blocks()) >= 5


def test_every_python_block_runs(tmp_path: Path) -> None:
    for i, block in enumerate(python_blocks()):
        script = tmp_path / f"block_{i}.py"
        script.write_text(block)
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, f"README block {i} failed:\n{block}\n--- stderr ---\n{done.stderr}"
        assert done.stdout.strip() or "import" in block, f"README block {i} printed nothing"


def test_readme_starts_with_make_demo_and_make_test() -> None:
    text = (ROOT / "README.md").read_text()
    first_block = re.search(r"```bash\n(.*?)```", text, flags=re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands[:2] == ["make demo", "make test"]
