"""Fixtures of the data tests (see qa_fixtures.py for the generators)."""
from qa_fixtures import hotpot_file, hotpot_large_file, squad_file, tokenizer  # noqa: F401
