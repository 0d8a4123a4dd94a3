"""Where a speedrun configuration's tokens come from: shard globs, or text prepared on first use."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evolve.harness.documents import stdlib_tests

from .shards import read_header, read_shard

STDLIB_VOCAB = 512
STDLIB_CACHE = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    / "evolve"
    / "speedrun"
    / f"stdlib-bpe{STDLIB_VOCAB}-v2"  # v2: validation text from the test package
)


class TokenizerMismatch(ValueError):
    """Shards made with another tokenizer than the one a configuration's target was set on."""


@dataclass(frozen=True, kw_only=True)
class DataSpec:
    """Shards for training and validation.

    Attributes:
        data_dir: folder holding the shards; ``stdlib`` means Python's standard library
            sources, tokenized into a cache folder on first use (works on any machine).
        train_glob: pattern of the training shards inside ``data_dir``.
        val_glob: pattern of the validation shards (read in sorted order).
        tokenizer: the tokenizer the configuration's target was set on (``gpt2`` or ``bpe``);
            shards that ``prepare_text`` made with another one are refused, not used. None
            checks nothing (shards without a ``prepared.json``, such as FineWeb's, are
            GPT-2's by their format's definition).
    """

    data_dir: str
    train_glob: str = "*_train_*.bin"
    val_glob: str = "*_val_*.bin"
    tokenizer: str | None = None

    def folder(self) -> Path:
        """The shard folder, preparing the stdlib corpus if asked for and missing."""
        if self.data_dir == "stdlib":
            return ensure_stdlib_shards(STDLIB_CACHE)
        folder = Path(self.data_dir).expanduser().resolve()  # the candidate runs elsewhere
        if not folder.is_dir():
            raise FileNotFoundError(
                f"speedrun data folder {folder} does not exist; download FineWeb shards with "
                "`python -m evolve.benchmarks.speedrun.download --out DIR` or tokenize text with "
                "`python -m evolve.benchmarks.speedrun.prepare_text`, then set data_dir"
            )
        self._check_tokenizer(folder)
        return folder

    def _check_tokenizer(self, folder: Path) -> None:
        """Refuse shards tokenized otherwise than the target assumes (a loss on other tokens)."""
        summary = folder / "prepared.json"
        if self.tokenizer is None or not summary.is_file():
            return
        made_with = json.loads(summary.read_text()).get("tokenizer")
        if made_with != self.tokenizer:
            raise TokenizerMismatch(
                f"speedrun shards in {folder} were tokenized with {made_with!r} ({summary}), but "
                f"this configuration's target is a loss on {self.tokenizer!r} tokens; tokenize the "
                f"text again with `python -m evolve.benchmarks.speedrun.prepare_text --tokenizer "
                f"{self.tokenizer} ...`, or set fitness.tokenizer={made_with} and a target of its own"
            )

    def train_files(self) -> list[Path]:
        """The training shards, sorted; each is checked to be a valid shard."""
        files = sorted(self.folder().glob(self.train_glob))
        if not files:
            raise FileNotFoundError(
                f"no training shards match {self.train_glob!r} in {self.folder()}"
            )
        for path in files:
            read_header(path)
        return files

    def hidden(self) -> list[Path]:
        """What candidates may not read: the shard folder and the text it was prepared from.

        The sources are those ``prepare_text`` recorded in ``prepared.json`` that still exist:
        for the ``stdlib`` corpus, its validation text's (the test package); its training text,
        the library itself, cannot be hidden from a Python program.
        """
        folder = self.folder()
        paths = [folder]
        if (folder / "prepared.json").is_file():
            summary = json.loads((folder / "prepared.json").read_text())
            for split in ("train", "val"):
                for source in summary.get(split, {}).get("sources", []):
                    if Path(source).exists():
                        paths.append(Path(source).resolve())
        return paths

    def val_files(self) -> list[Path]:
        """The validation shards, sorted (hidden from candidates by the sandbox)."""
        return sorted(self.folder().glob(self.val_glob))

    def val_tokens(self, count: int) -> np.ndarray:
        """The first ``count + 1`` validation tokens (``count`` targets), as uint16."""
        files = self.val_files()
        if not files:
            raise FileNotFoundError(
                f"no validation shards match {self.val_glob!r} in {self.folder()}"
            )
        parts, have = [], 0
        for path in files:
            tokens = read_shard(path)
            parts.append(np.asarray(tokens[: count + 1 - have]))
            have += parts[-1].size
            if have >= count + 1:
                return np.concatenate(parts).astype("<u2")
        raise ValueError(
            f"validation shards in {self.folder()} hold {have} tokens; val_tokens={count} needs {count + 1}; "
            "lower val_tokens (a multiple of the eval sequence length) or add validation text"
        )


def ensure_stdlib_shards(folder: Path) -> Path:
    """Tokenize Python's standard library into train/val shards once; return the folder.

    Training text is the library, validation text its test package (recorded as the
    validation source, so ``DataSpec.hidden`` hides it from candidates). For speed on CPU the
    tokens come from a byte-level BPE of ``STDLIB_VOCAB`` ids trained on the training files
    (end-of-text = the last id, 511), not from GPT-2's vocabulary.
    """
    if (folder / "prepared.json").is_file():
        return folder
    from .prepare_text import prepare, stdlib_documents

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".stdlib-"))
    prepare(
        train=None,
        val=[stdlib_tests()],  # recorded as the source; the text comes from val_docs
        out=tmp,
        prefix="stdlib",
        tokenizer_kind="bpe",
        bpe_vocab=STDLIB_VOCAB,
        train_docs=stdlib_documents(every=5, offset=1, limit_bytes=1_500_000),
        val_docs=stdlib_documents(tests=True, every=5, limit_bytes=200_000, max_chars=4000),
    )
    try:
        tmp.rename(folder)
    except OSError:  # another worker finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
