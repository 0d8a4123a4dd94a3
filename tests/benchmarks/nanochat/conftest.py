"""Shared fixtures of the nanochat tests: a tiny prepared dataset."""

import sysconfig
from pathlib import Path

import pytest
from evolve.benchmarks.nanochat import prepare
from evolve.benchmarks.nanochat.sources import chunk_text


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """A tiny dataset ("tiny", vocab 512) from a few standard-library files."""
    root = tmp_path_factory.mktemp("nanochat-data")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [
        c
        for name in ("argparse.py", "textwrap.py", "pathlib.py", "json/decoder.py")
        for c in chunk_text((stdlib / name).read_text())
    ]
    val = [c for c in chunk_text((stdlib / "string.py").read_text())]
    prepare.build(
        root / "tiny", train=lambda: texts, val=lambda: val * 3, vocab_size=512, log=lambda _: None
    )
    return root
