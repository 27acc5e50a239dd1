"""`memagent profile from-reference` on a small tree in the shape of the official repository.

The tree is written here with our own dummy wording (the official text is not copied): template
strings in `str.format` style with `{prompt}` and `{{}}`-escaped braces, baseline templates with
$DOC$ / $Q$, and settings as `int(os.getenv(NAME, DEFAULT))`.
"""
from __future__ import annotations

import sys

import pytest

from memagent.protocol.profile import load_profile
from memagent.protocol.reference import ReferenceError, profile_from_reference

UTILS = "taskutils/memory_eval/utils"

AGENT_FILE = '''from .envs import URL
import os

TEMPLATE = """Mem task.

<p> 
{prompt}
</p>
<m>{memory}</m>
<s>{chunk}</s>
"""

TEMPLATE_FINAL = """Final task %s.
<p>{prompt}</p>
<m>{memory}</m>
"""

NO_MEMORY = "nothing yet"


def side_effect():
    raise SystemExit("this file must never be run")
'''

ENVS = '''import os
MAX_INPUT_LEN=int(os.getenv('MAX_INPUT_LEN', '1200'))
MAX_OUTPUT_LEN=int(os.getenv('MAX_OUTPUT_LEN', '100'))
URL = f"http://{os.getenv('SERVE_HOST', '127.0.0.1')}/v1"
RECURRENT_CHUNK_SIZE=int(os.getenv('RECURRENT_CHUNK_SIZE', '50'))
RECURRENT_MAX_NEW=int(os.getenv('RECURRENT_MAX_NEW', '16'))
raise SystemExit("never run")
'''


def _tree(root, skip=()):
    files = {
        f"{UTILS}/recurrent.py": AGENT_FILE.replace("%s", 'say "so the answer is X"'),
        f"{UTILS}/recurrent_boxed.py": AGENT_FILE.replace("%s", "box it in \\\\boxed{{}}"),
        f"{UTILS}/openai_api.py": 'template_0shot = """Read.\n$DOC$\nAsk: $Q$\nsay the answer is X"""\n',
        f"{UTILS}/boxed.py": 'template_0shot = """Read.\n$DOC$\nAsk: $Q$\nbox {{}}"""\n',
        f"{UTILS}/envs.py": ENVS,
    }
    for rel, text in files.items():
        if rel in skip:
            continue
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_phrase_profile_from_a_tree_in_the_official_shape(tmp_path):
    # envs.py ends in `raise SystemExit`: importing or running it would end the test
    p = profile_from_reference(_tree(tmp_path))
    assert p.name == "official-phrase"
    assert p.prompts.memory_template == "Mem task.\n\n<p> \n{question}\n</p>\n<m>{memory}</m>\n<s>{chunk}</s>\n"
    assert p.prompts.final_template == 'Final task say "so the answer is X".\n<p>{question}</p>\n<m>{memory}</m>\n'
    assert p.prompts.empty_memory == "nothing yet"
    assert p.prompts.baseline_template == "Read.\n{context}\nAsk: {question}\nsay the answer is X"
    assert (p.prompts.answer_protocol, p.prompts.think) == ("phrase", "strip")
    s, b, sc = p.sampling, p.budgets, p.scoring
    assert (s.temperature, s.top_p, s.seed, s.repeats) == (0.7, 0.95, None, 1)
    assert (b.chunk_tokens, b.memory_tokens, b.answer_tokens, b.document_tokens) == (50, 16, 16, None)
    assert (b.baseline_answer_tokens, b.baseline_window, b.yarn_factor) == (100, 1200 + 100, None)
    assert (sc.golds, sc.empty, sc.failed) == ("first", "zero", "skip")


def test_the_boxed_profile_unescapes_format_braces_but_not_the_baselines(tmp_path):
    p = profile_from_reference(_tree(tmp_path), "boxed", baseline_input_tokens=9000, yarn_factor=4.0)
    assert p.prompts.final_template.startswith("Final task box it in \\boxed{}.\n")
    assert p.prompts.baseline_template.endswith("box {{}}")  # filled with str.replace: braces as written
    assert p.prompts.answer_protocol == "boxed"
    assert (p.budgets.baseline_window, p.budgets.yarn_factor) == (9100, 4.0)


def test_the_cli_writes_a_profile_that_loads_back(tmp_path, monkeypatch, capsys):
    from memagent.cli import main

    out = tmp_path / "official.yaml"
    monkeypatch.setattr(sys, "argv", ["memagent", "profile", "from-reference", str(_tree(tmp_path / "ref")),
                                      "--out", str(out)])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code in (0, None)
    assert load_profile(out) == profile_from_reference(tmp_path / "ref")


@pytest.mark.parametrize("rel", [f"{UTILS}/recurrent.py", f"{UTILS}/openai_api.py", f"{UTILS}/envs.py"])
def test_a_missing_file_is_named(tmp_path, rel):
    with pytest.raises(ReferenceError) as e:
        profile_from_reference(_tree(tmp_path, skip=(rel,)))
    assert f"lacks {rel}" in str(e.value) and "BytedTsinghua-SIA/MemAgent" in str(e.value)


def test_a_missing_name_and_a_wrong_placeholder_are_named(tmp_path):
    root = _tree(tmp_path)
    (root / UTILS / "recurrent.py").write_text(AGENT_FILE.replace('NO_MEMORY = "nothing yet"', ""))
    with pytest.raises(ReferenceError, match=r"recurrent.py does not assign NO_MEMORY \(expected top-level "
                                             r"assignments TEMPLATE, TEMPLATE_FINAL, NO_MEMORY\)"):
        profile_from_reference(root)
    (root / UTILS / "recurrent.py").write_text(AGENT_FILE.replace("{chunk}", "{section}"))
    with pytest.raises(ReferenceError, match=r"TEMPLATE has the placeholder \{section\}"):
        profile_from_reference(root)
    (root / UTILS / "recurrent.py").write_text(AGENT_FILE)
    (root / UTILS / "envs.py").write_text("RECURRENT_CHUNK_SIZE = compute()\n")
    with pytest.raises(ReferenceError, match="RECURRENT_CHUNK_SIZE is not a literal value"):
        profile_from_reference(root)
    with pytest.raises(ReferenceError, match="not a folder"):
        profile_from_reference(tmp_path / "none")
