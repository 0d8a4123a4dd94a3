"""The README as a newcomer follows it: every block marked runnable runs as written, and the files it shows are the files.

A fenced block right after ``<!-- doctest: ... -->`` runs on a CPU machine: each line of a
``bash`` block is one command, a ``python`` block one script, all in a fresh directory
holding a copy of ``examples/``. A block after ``<!-- file: PATH -->`` must equal that file.
The Quickstart's install lines are what ``.ci/run`` runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

README = (REPO / "README.md").read_text()
MARKED = re.compile(r"<!-- (doctest|file):? ?(.*?) -->\n```(\w+)\n(.*?)```", re.S)


def marked(kind: str) -> list[tuple[str, str, str]]:
    """(note, language, body) of each block marked ``kind``, in README order."""
    return [(note, lang, body) for k, note, lang, body in MARKED.findall(README) if k == kind]


COMMANDS = [line for _, lang, body in marked("doctest") if lang == "bash" for line in body.splitlines() if line.strip()]
SCRIPTS = [body for _, lang, body in marked("doctest") if lang == "python"]
FILES = {note: body for note, _, body in marked("file")}


def quickstart() -> list[str]:
    """The Quickstart's two command lines, without their comments."""
    block = re.search(r"## Quickstart.*?```bash\n(.*?)```", README, re.S)[1]
    return [re.sub(r"\s+#.*$", "", line) for line in block.splitlines()]


def run(command: list[str], cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    """``command`` in ``cwd`` with this virtualenv's ``python`` first on PATH."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(REPO),
        "HYDRA_FULL_ERROR": "0",
    }
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def newcomer(tmp_path: Path) -> Path:
    """A fresh directory with the repository's examples, as a clone's root has them."""
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    return tmp_path


def test_the_readme_marks_its_runnable_blocks():
    assert len(COMMANDS) >= 5 and len(SCRIPTS) >= 2 and len(FILES) == 3
    assert any("examples/shellsort" in c for c in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_readme_command_runs_as_written(command, newcomer):
    result = run(["bash", "-c", command], newcomer)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    if "examples/shellsort" in command:  # the custom-fitness example improves on its seed
        scores = re.search(r"^seed (\S+)  ->  best (\S+) ", result.stdout, re.M)
        assert scores and float(scores[2]) < float(scores[1]), result.stdout[-2000:]  # comparisons: lower is better


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.splitlines()[0][:40])
def test_a_readme_python_block_runs_as_written(script, newcomer):
    (newcomer / "block.py").write_text(script)
    result = run([sys.executable, "block.py"], newcomer)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("path", sorted(FILES))
def test_the_readme_shows_the_example_files_as_they_are(path):
    assert FILES[path] == (REPO / path).read_text(), f"README's copy of {path} differs: paste the file again"


def test_ci_runs_the_quickstart_lines():
    install, tests = quickstart()
    assert install.startswith('pip install "torch==2.13.0" -e . && python -m evolve')
    assert tests == 'pip install -e ".[dev]" && ruff check . && pytest'
    ci = (REPO / ".ci" / "run").read_text()
    extract = next(line for line in ci.splitlines() if line.startswith("mapfile -t QUICKSTART"))
    shown = subprocess.run(
        ["bash", "-c", f'{extract}\nprintf "%s\\n" "${{QUICKSTART[@]}}"'],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    assert shown == [install, tests]
    assert 'eval "${QUICKSTART[1]}"' in ci  # CI runs line 2 as written


@pytest.mark.slow
def test_quickstart_line_1_runs_the_main_job(newcomer):
    command = quickstart()[0].split(" && ", 1)[1]  # the install is .ci/run's
    result = run(["bash", "-c", command], newcomer, timeout=3600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "reached search.max_candidates=300" in result.stdout
