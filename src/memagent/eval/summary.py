"""`summary.json` of an eval run: what was run (resolved options, sweep settings and their fingerprint),
on what (model, data files with their sha256), with what (package versions, the git revision of the memagent
checkout), and how it went (records planned, finished, failed)."""
from __future__ import annotations

import dataclasses
import json
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

import memagent
from memagent.backends.redact import public_url
from memagent.eval.records import atomic_write_lines

__all__ = ["git_revision", "versions", "write_summary"]

_MAX_LISTED_FAILURES = 50


def versions() -> dict[str, str | None]:
    """Installed versions of memagent, torch, transformers (None when absent) and python; nothing is imported."""
    out: dict[str, str | None] = {}
    for name in ("memagent", "torch", "transformers"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = memagent.__version__ if name == "memagent" else None
    out["python"] = platform.python_version()
    return out


def git_revision(path: str | Path | None = None) -> str | None:
    """The commit checked out where `path` (default: the memagent package) lives; None when not in git."""
    where = Path(path) if path is not None else Path(__file__).resolve().parent.parent
    try:  # the package's own files must be tracked: a venv inside some other repository is not a checkout
        tracked = subprocess.run(["git", "-C", str(where), "ls-files", "--error-unmatch", "__init__.py"],
                                 capture_output=True, text=True, timeout=10, check=False)
        done = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    rev = done.stdout.strip()
    return rev if tracked.returncode == 0 and done.returncode == 0 and len(rev) >= 40 else None


def _counts(keys: Sequence[str], records: dict[str, dict]) -> dict[str, int]:
    mine = [records[k] for k in keys if k in records]
    failed = sum(r.get("status") == "error" for r in mine)
    out: dict[str, Any] = dict(planned=len(keys), finished=len(mine) - failed, failed=failed,
                               missing=len(keys) - len(mine))
    methods = sorted({r["method"] for r in mine})
    if len(methods) > 1:  # one row per method (workflow or baseline): finished and failed
        out["by_method"] = {m: dict(finished=sum(r["method"] == m and r.get("status") != "error" for r in mine),
                                    failed=sum(r["method"] == m and r.get("status") == "error" for r in mine))
                            for m in methods}
    return out


def _failures(keys: Sequence[str], records: dict[str, dict]) -> list[dict[str, Any]]:
    out = []
    for k in keys:
        r = records.get(k)
        if r is not None and r.get("status") == "error":
            out.append(dict(key=k, method=r["method"], data=r["data_path"], sample_id=r["sample_id"],
                            repeat=r["repeat"], **r["error"]))
    return out[:_MAX_LISTED_FAILURES]


def write_summary(out_dir: str | Path, *, options: dict[str, Any], cfg: Any, fingerprint: str, datas: Sequence[Any],
                  keys: Sequence[str], records: dict[str, dict], fingerprints: dict[str, str] | None = None) -> Path:
    """Write `out_dir/summary.json` atomically; returns its path. fingerprints: each method's record fingerprint
    (a workflow's folds in its name and options) where one differs from `fingerprint`."""
    options = dict(options)
    backend = options["backend"] = dict(options.get("backend") or {})  # the shared backend options
    if isinstance(backend.get("base_url"), str):
        backend["base_url"] = public_url(backend["base_url"])  # never a user:password@ in the file
    summary = dict(
        model=cfg.model_name,
        settings=dict(options=options, sweep=dataclasses.asdict(cfg), fingerprint=fingerprint,
                      **({"fingerprints": fingerprints} if fingerprints else {})),
        data=[dataclasses.asdict(d) for d in datas],
        versions=versions(),
        git_revision=git_revision(),
        records=_counts(keys, records),
        failures=_failures(keys, records),
    )
    text = json.dumps(summary, indent=2, ensure_ascii=False, default=str) + "\n"
    return atomic_write_lines(Path(out_dir) / "summary.json", [text])
