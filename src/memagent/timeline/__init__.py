"""The memory timeline of a run, in one place: what `memagent serve`'s page, `memagent report` and the harnesses
show of a trace.

    rows.py    pure functions over trace records: one row per chunk read (`timeline_rows`), the word diff
               (`word_diff`), the evidence steps the final memory came from (`evidence_steps`) and their pages,
               chapters or headings (`evidence_sources`), records per document (`group_by_doc`), calls of other
               kinds (`other_calls`); re-exported here
    report.py  `memagent report`: a trace as one self-contained HTML file (`write_report`), with the service
               page's CSS and JS (`memagent/serve/static/`) inlined

Every module here imports only base helpers (errors, io, jsonl): the timeline sits in the base layer, so the
service, the harnesses and the commands can all use it.
"""
from __future__ import annotations

from memagent.timeline.rows import (Record, evidence_sources, evidence_steps, group_by_doc, is_memory,
                                    memory_records, other_calls, timeline_rows, word_diff, word_sources)

__all__ = ["Record", "evidence_sources", "evidence_steps", "group_by_doc", "is_memory", "memory_records",
           "other_calls", "timeline_rows", "word_diff", "word_sources"]
