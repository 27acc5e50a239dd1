"""What a training run reports: metrics.jsonl (resumable), optional TensorBoard scalars and Weights & Biases
run, the progress bar."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from memagent.config import ConfigError
from memagent.rl.checkpoint import TrainOutputError
from memagent.rl.distributed import DistInfo

log = logging.getLogger(__name__)


class MetricsLog:
    """metrics.jsonl (one record a step) and optional TensorBoard scalars, written by rank 0.

    resume_step: records of later steps (written before a crash, after the checkpoint resumed
    from) are dropped, so the file reads as one uninterrupted run; a last line cut short by a
    crash is dropped too. The file is never rewritten in place: when lines go, the kept ones are
    written to a temporary file that replaces it (os.replace), else it is only appended to.
    A fresh run (resume_step 0) starts an empty file the same way.
    """

    def __init__(self, out_dir: Path, info: DistInfo, tensorboard: bool = False, resume_step: int = 0,
                 name: str = "metrics.jsonl", wandb: dict[str, Any] | None = None,
                 config: dict[str, Any] | None = None) -> None:
        self.enabled = info.is_main
        self.path = Path(out_dir) / name
        self._tb = None
        self._wandb = None
        if not self.enabled:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            kept, whole = kept_records(self.path, resume_step) if resume_step else ([], not self.path.exists())
            if not whole:
                tmp = self.path.with_name(self.path.name + ".tmp")
                tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
                os.replace(tmp, self.path)
        except OSError as e:
            raise TrainOutputError(f"cannot write {self.path}: {e}; free disk space or choose another out_dir") from None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ImportError("tensorboard=true needs the tensorboard package: pip install 'memagent[tensorboard]'") from None
            self._tb = SummaryWriter(str(Path(out_dir) / "tb"))
        if wandb is not None:
            self._wandb = start_wandb(Path(out_dir), wandb, config or {}, fresh=resume_step == 0)

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as e:
            raise TrainOutputError(f"cannot append step {record.get('step')} to {self.path}: {e}; free disk space "
                                   "and resume (the last checkpoint is intact)") from None
        if self._tb is not None:
            for k, v in record.items():
                if isinstance(v, (int, float)) and k != "step":
                    self._tb.add_scalar(k, v, record["step"])
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"},
                            step=record["step"])

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


WANDB_ID_FILE = "wandb_run_id.txt"


def start_wandb(out_dir: Path, opts: dict[str, Any], config: dict[str, Any], fresh: bool) -> Any:
    """A Weights & Biases run for `out_dir` (LogConfig fields in `opts`). Its id is kept in
    out_dir/wandb_run_id.txt, so a resumed training run goes on logging into the same W&B run."""
    try:
        import wandb
    except ImportError:
        raise ConfigError("log.wandb=true needs the wandb package: pip install 'memagent[wandb]' "
                          "(then `wandb login`), or set log.wandb=false") from None
    id_file = out_dir / WANDB_ID_FILE
    run_id = None if fresh or not id_file.is_file() else id_file.read_text(encoding="utf-8").strip()
    if run_id is None:
        run_id = wandb.util.generate_id()
        id_file.write_text(run_id + "\n", encoding="utf-8")
    return wandb.init(project=opts.get("project") or "memagent", name=opts.get("name") or out_dir.resolve().name,
                      entity=opts.get("entity") or None, id=run_id, resume="allow", config=config,
                      dir=str(out_dir))


def kept_records(path: Path, resume_step: int) -> tuple[list[str], bool]:
    """(the lines of `path` of steps <= resume_step, whether the file already holds exactly those).

    A last line without its newline that is not JSON was cut short by a crash: dropped with a
    warning. Any other line that is not a JSON record is an error naming it."""
    if not path.is_file():
        return [], False
    data = path.read_bytes()
    lines = data.decode("utf-8", errors="replace").split("\n")
    torn = lines.pop()  # "" when the file ends with a newline
    kept = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if _step_of(record, path, n) <= resume_step:
            kept.append(line)
    if torn.strip():
        try:
            record = json.loads(torn)
        except ValueError:
            log.warning("%s: dropped its last line, cut short by a crash: %r", path, torn[:80])
        else:
            if _step_of(record, path, len(lines) + 1) <= resume_step:
                kept.append(torn)
    return kept, not torn and len(kept) == sum(1 for line in lines if line.strip())


def _step_of(record: Any, path: Path, n: int) -> int:
    """The integer step of metrics record `record` (line n of `path`; 0 when it has none), else a ConfigError."""
    if not isinstance(record, dict):
        raise ConfigError(f"{path}:{n} is not a metrics record; move the file away to resume")
    step = record.get("step", 0)
    if isinstance(step, bool) or not isinstance(step, int):
        raise ConfigError(f"{path}:{n} is not a metrics record (its step is {str(step)[:40]!r}, not an integer); "
                          "move the file away to resume")
    return step


class Progress:
    """Training progress over steps showing the latest reward/loss (`memagent.progress.StepProgress`: a bar on a
    terminal, a plain line every 5% in a log); a no-op when disabled."""

    def __init__(self, total: int, done: int, enabled: bool, what: str = "train") -> None:
        from memagent.progress import StepProgress

        self._p = StepProgress(what, total, done) if enabled else None

    def advance(self, rec: dict[str, Any]) -> None:
        if self._p is None:
            return
        shown = [f"{k} {rec[k]:.3g}" for k in ("reward", "loss", "kl") if isinstance(rec.get(k), (int, float))]
        self._p.update(1, " ".join(shown))

    def close(self) -> None:
        if self._p is not None:
            self._p.close()
