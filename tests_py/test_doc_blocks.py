"""Every ```python block of README.md and docs/*.md runs as pasted (docs/development.md#code-blocks-in-the-docs-run).

Each block runs alone, as a script, in a fresh temporary directory. A following ```output block
is the stdout it must print. ```python no-run: <reason> marks a block that cannot run as pasted;
the count of those per file is pinned below so they cannot grow silently. ```python pytest is a
test module, run with pytest.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK_TIMEOUT = 180  # seconds; a block is a small script, but CI is a loaded 2-core machine

# Blocks that are deliberately not runnable, per file. Change a number only together with the
# block it counts, and give the block its reason.
NO_RUN_PINNED: dict[str, int] = {
    "docs/observability.md": 1,
    "docs/postgres.md": 2,
    "docs/production.md": 1,
}

FENCE = re.compile(r"^(\s*)```(.*)$")


@dataclass
class Block:
    file: str
    line: int  # 1-based line of the opening fence
    info: str
    text: str
    output: str | None = None  # the ```output block that follows, if any

    @property
    def kind(self) -> str:
        return self.info.split(":", 1)[0].split()[0] if self.info else ""

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"


def parse_blocks(path: Path) -> list[Block]:
    """Fenced blocks in order; an ``output`` block is attached to the python block before it."""
    lines = path.read_text().splitlines()
    rel = path.relative_to(ROOT).as_posix()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, info = m.group(1), m.group(2).strip()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not re.match(rf"^{re.escape(indent)}```\s*$", lines[j]):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        if j >= len(lines):
            raise AssertionError(f"{rel}:{i + 1}: fence never closed")
        blocks.append(Block(rel, i + 1, info, "\n".join(body) + "\n"))
        i = j + 1
    out: list[Block] = []
    for b in blocks:
        if b.info == "output":
            prev = out[-1] if out else None
            if prev is None or not prev.info.startswith("python") or prev.output is not None:
                raise AssertionError(f"{b.id}: an output block must follow a python block")
            prev.output = b.text
            continue
        out.append(b)
    return out


ALL_BLOCKS = [b for f in DOC_FILES for b in parse_blocks(f)]
PY_BLOCKS = [b for b in ALL_BLOCKS if b.info.startswith("python")]
RUNNABLE = [b for b in PY_BLOCKS if not b.info.startswith("python no-run")]


def output_matches(expected: str, actual: str) -> bool:
    """Line by line, trailing spaces and blank lines ignored; a line ``...`` matches any lines."""
    exp = [line.rstrip() for line in expected.strip("\n").splitlines()]
    act = [line.rstrip() for line in actual.strip("\n").splitlines()]
    pattern = "".join(".*?" if line == "..." else re.escape(line + "\n") for line in exp)
    return re.fullmatch(pattern, "\n".join(act) + "\n", flags=re.S) is not None


def run_block(block: Block, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENXGRAPH_FAILPOINTS")}
    if block.kind == "python" and block.info.split()[1:2] == ["pytest"]:
        (tmp / "test_block.py").write_text(block.text)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_block.py"]
    else:
        (tmp / "block.py").write_text(block.text)
        cmd = [sys.executable, "block.py"]
    return subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT)


def test_the_docs_have_blocks_to_check() -> None:
    # A parser that silently finds nothing would pass every test below.
    assert len(RUNNABLE) >= 5
    assert any(b.output is not None for b in RUNNABLE)


def test_no_run_blocks_give_a_reason_and_are_counted() -> None:
    counts: dict[str, int] = {}
    for b in PY_BLOCKS:
        if b.info.startswith("python no-run"):
            reason = b.info.partition(":")[2].strip()
            assert b.info.startswith("python no-run:") and len(reason) >= 10, (
                f"{b.id}: write ```python no-run: <why it cannot run as pasted>"
            )
            counts[b.file] = counts.get(b.file, 0) + 1
    assert counts == NO_RUN_PINNED


def test_unknown_python_fence_options_are_refused() -> None:
    for b in PY_BLOCKS:
        assert b.info in ("python", "python pytest") or b.info.startswith("python no-run:"), b.id


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.id for b in RUNNABLE])
def test_block_runs_as_pasted(block: Block, tmp_path: Path) -> None:
    proc = run_block(block, tmp_path)
    assert proc.returncode == 0, f"{block.id} failed:\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    if block.output is not None:
        assert output_matches(block.output, proc.stdout), (
            f"{block.id} printed:\n{proc.stdout}\nthe docs show:\n{block.output}"
        )


def _readme_block(starts_with: str, info: str = "python") -> Block:
    hits = [b for b in parse_blocks(ROOT / "README.md") if b.info == info and b.text.startswith(starts_with)]
    assert len(hits) == 1, f"expected one README {info} block starting with {starts_with!r}"
    return hits[0]


def test_readme_10xgraph_json_works_next_to_the_quickstart(tmp_path: Path) -> None:
    """The sample 10xgraph.json, as pasted, next to the quickstart saved as agent.py: the CLI
    finds the checkpointer, and the ledger shows the tool's own result, not the envelope."""
    quickstart = next(b for b in RUNNABLE if b.file == "README.md" and "SqliteCheckpointer(\"agent.db\")" in b.text)
    (tmp_path / "agent.py").write_text(quickstart.text)
    config = _readme_block('{"graph"', info="json")
    (tmp_path / "10xgraph.json").write_text(config.text)
    first = subprocess.run([sys.executable, "agent.py"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=BLOCK_TIMEOUT)
    assert first.returncode == 0, first.stderr
    cli = shutil.which("tenxgraph", path=str(Path(sys.executable).parent))
    assert cli is not None

    listed = subprocess.run([cli, "--json", "threads", "list"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=BLOCK_TIMEOUT)
    assert listed.returncode == 0, listed.stderr
    assert [t["thread_id"] for t in json.loads(listed.stdout)] == ["order-4821"]

    call = subprocess.run([cli, "ledger", "order-4821", "--call", "call_1"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=BLOCK_TIMEOUT)
    assert call.returncode == 0, call.stderr
    assert "__kind__" not in call.stdout
    assert "charged 129.00 USD for order 4821" in call.stdout


def test_output_matching_rules() -> None:
    assert output_matches("a\nb\n", "a  \nb\n\n")
    assert output_matches("a\n...\nc\n", "a\nx\ny\nc\n")
    assert not output_matches("a\nb\n", "a\nc\n")
    assert not output_matches("a\n", "a\nextra\n")
