import pytest

from memagent.prompts import PAPER_FINAL_TEMPLATE, PAPER_MEMORY_TEMPLATE, render
from memagent.config import AgentConfig, ConfigError


def test_paper_templates_have_the_paper_shape():
    for tag in ("<problem>", "<memory>", "<section>", "Updated memory:"):
        assert tag in PAPER_MEMORY_TEMPLATE
    assert "<section>" not in PAPER_FINAL_TEMPLATE and "\\boxed{}" in PAPER_FINAL_TEMPLATE


def test_render_is_single_pass():
    out = render("Q={question} M={memory} C={chunk}", question="q", memory="{chunk}", chunk="{question}")
    assert out == "Q=q M={chunk} C={question}"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(memory_template="{question} {memory}"), "{chunk}"),
        (dict(final_template="{question}"), "{memory}"),
        (dict(final_template="{question} {memory} {chunk}"), "cannot fill"),
        (dict(chunk_tokens=0), "chunk_tokens"),
        (dict(memory_tokens=-5), "memory_tokens"),
        (dict(temperature=-1.0), "temperature"),
    ],
)
def test_bad_config_is_rejected_with_a_message(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        AgentConfig(**kwargs)
