"""`memagent ask`: questions over documents of any length, one at a time or many from a JSONL file.

    driver.py   AskOptions (one field per command-line option) and `run_ask`, the command's run: the checks,
                the settings (`memagent.protocol.resolve`), the backend, the workflow, --ray sharding
    io.py       its files: --input records (`read_inputs`), the output checks before any model call
                (`check_ask_outputs`), --output written one result a line and resumed (`ResultLog`)

Only the commands (`memagent.cli`) import this package; the layers below resolve settings with
`memagent.protocol.resolve`.
"""
from __future__ import annotations

from memagent.ask.driver import AskOptions, run_ask
from memagent.ask.io import (DocumentsFailed, ResultLog, check_ask_outputs, check_result_file, document_inputs,
                             failures_error, profile_path_for, read_inputs)

__all__ = ["AskOptions", "DocumentsFailed", "ResultLog", "check_ask_outputs", "check_result_file", "document_inputs",
           "failures_error", "profile_path_for", "read_inputs", "run_ask"]
