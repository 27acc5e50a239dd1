"""Shared fixtures (generators in qa_fixtures.py): the tiny tokenizer and QA sources in the public formats."""
from qa_fixtures import hotpot_file, hotpot_large_file, squad_file, tokenizer  # noqa: F401
