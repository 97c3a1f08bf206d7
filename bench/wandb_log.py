"""wandb logging of an experiment run: each cell's metrics as it finishes, then the
results table, the headline figures and the report's plots. Offline by default (runs
land in ./wandb and can be synced later); `disabled` never imports wandb."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["WandbLogger"]

MODES = ("offline", "online", "disabled")


class WandbLogger:
    def __init__(
        self, *, mode: str, project: str, experiment: str, config: dict, entity: str | None = None
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"wandb.mode={mode!r}; allowed values: {', '.join(MODES)}")
        self.run = None
        self.step = 0
        if mode == "disabled":
            return
        import wandb

        self._wandb = wandb
        # The mode must be global, not only the run's: wandb's usage telemetry reads the
        # global settings and would otherwise post to the server from an offline run.
        wandb.setup(settings=wandb.Settings(mode=mode))
        self.run = wandb.init(
            project=project,
            entity=entity,
            name=experiment,
            job_type=experiment,
            mode=mode,
            config=config,
            reinit="finish_previous",
        )

    @property
    def run_dir(self) -> Path | None:
        return Path(self.run.dir).parent if self.run else None

    def log_row(self, row: dict[str, Any]) -> None:
        if not self.run:
            return
        numeric = {
            k: v
            for k, v in row.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and not math.isnan(v)
        }
        numeric["ok"] = int(row.get("status") == "ok")
        self.run.log(numeric, step=self.step)
        self.step += 1

    def log_report(self, df: pd.DataFrame, headline: dict, report_dir: Path) -> None:
        if not self.run:
            return
        wandb = self._wandb
        self.run.log({"results": wandb.Table(dataframe=df.astype(str))}, step=self.step)
        for png in sorted(Path(report_dir).glob("*.png")):
            self.run.log({f"plots/{png.stem}": wandb.Image(str(png))}, step=self.step)
        for key, value in headline.items():
            if isinstance(value, int | float | str) and not isinstance(value, bool):
                self.run.summary[f"headline/{key}"] = value
        for target in headline.get("targets", []):  # each judged on its worst cell
            for field in ("met", "cells", "median", "worst"):
                if target.get(field) is not None:
                    self.run.summary[f"targets/{target['figure']}/{field}"] = target[field]

    def finish(self) -> None:
        if self.run:
            self.run.finish()
            self.run = None
