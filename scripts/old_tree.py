"""Write an older commit's training path (its ``evolve`` package and benchmarks) into ``.old/COMMIT``.

The tree is laid out as the installed package is (``benchmarks/`` under ``evolve/``), so that a
process with ``PYTHONPATH=.old/COMMIT`` imports that commit's ``evolve`` and
``evolve.benchmarks`` instead of the working tree's (``scripts/fixed_steps.py`` runs the
seeds of both that way). ``.old/`` is ignored by git; carry it to the device with ``run``'s
``carry``. Usage: ``python scripts/old_tree.py d648b9c`` (prints the folder).
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OLD = REPO / ".old"
PATHS = ("evolve", "benchmarks/__init__.py", "benchmarks/nanochat", "benchmarks/speedrun")
SKIPPED_PARTS = ("results", "__pycache__")  # measurements and caches: not code


def target_name(member: str) -> str | None:
    """Where an archive member goes in the tree (None: left out)."""
    parts = Path(member).parts
    if any(part in SKIPPED_PARTS for part in parts) or member.endswith(".md"):
        return None
    if parts[0] == "benchmarks":
        return str(Path("evolve", *parts))
    return member


def export(commit: str, root: Path = OLD) -> Path:
    """Write ``commit``'s training path into ``root/<full hash>`` (replacing it); the folder."""
    full = subprocess.run(
        ["git", "rev-parse", "--verify", f"{commit}^{{commit}}"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    archive = subprocess.run(
        ["git", "archive", "--format=tar", full, *PATHS], cwd=REPO, capture_output=True, check=True
    ).stdout
    folder = root / full
    shutil.rmtree(folder, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            name = target_name(member.name)
            if name is None or not member.isfile():
                continue
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(tar.extractfile(member).read())
    (folder / "COMMIT").write_text(full + "\n")
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commit", help="the commit to write out, e.g. d648b9c")
    parser.add_argument("--root", type=Path, default=OLD, help="where the trees go (default .old/)")
    args = parser.parse_args(argv)
    print(export(args.commit, args.root))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
