"""``python -m evolve [overrides]``: run or resume a search (Hydra entry point)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from evolve.cli import (
    check_start_arguments,
    discard_start,
    fail_to_start,
    report,
    sweep_overview,
)
from evolve.launch.config import as_dict, hydra_errors
from evolve.settings import ConfigError

if TYPE_CHECKING:
    from evolve.search.driver import Summary

SWEEP: list[tuple[list[str], Path, Summary]] = []  # each run of a ``-m`` sweep, in order


@hydra.main(version_base=None, config_path="pkg://evolve.configs", config_name="config")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    overrides = OmegaConf.to_container(hydra_cfg.overrides.task, resolve=False)  # as typed
    run_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        resolved = as_dict(cfg)
    except ConfigError as exc:
        discard_start(run_dir, {})
        fail_to_start(str(exc))
    summary = report(resolved, run_dir, overrides)
    if hydra_cfg.mode == RunMode.MULTIRUN and summary is not None:
        SWEEP.append((overrides, run_dir, summary))


if __name__ == "__main__":
    check_start_arguments(sys.argv[1:])
    try:
        with hydra_errors():
            main()
    except ConfigError as exc:
        fail_to_start(str(exc))
    if SWEEP:
        print(f"\n{sweep_overview(SWEEP)}")
