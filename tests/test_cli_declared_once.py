"""Each option declared once (issue 25): every command's options come from the fields of its option dataclass
(`memagent.cli.params.options_command`), and each option's rule sits beside its field, checked by one checker
(`memagent.flags.check_options`), with no table of rules keyed by option name left anywhere."""
from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest
import typer

from memagent.cli import app
from memagent.cli.params import flag_fields
from memagent.errors import InputError
from memagent.flags import check_options, flag_decls, flag_key

SRC = Path(__file__).resolve().parents[1] / "src" / "memagent"


def _commands(t: typer.Typer, prefix: str = ""):
    """(command path, its callback) of every command registered on `t`, sub-apps included."""
    for info in t.registered_commands:
        name = info.name or info.callback.__name__.replace("_", "-")
        yield f"{prefix}{name}", info.callback
    for group in t.registered_groups:
        yield from _commands(group.typer_instance, f"{prefix}{group.name} ")


COMMANDS = dict(_commands(app))


def test_the_walk_finds_every_command():
    assert {"ask", "eval", "serve", "train", "demo", "tiny-model", "flops", "merge-lora", "report",
            "data toy", "data ruler", "data ruler-hqa", "data import", "profile from-reference"} <= set(COMMANDS)


def _click(name: str):
    cmd = typer.main.get_command(app)
    for part in name.split():
        cmd = cmd.commands[part]
    return cmd


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_of_every_command_is_a_dataclass_field(name):
    callback = COMMANDS[name]
    by_hand = [p.name for p in inspect.signature(callback).parameters.values()
               if isinstance(p.default, typer.models.ParameterInfo)]
    assert not by_hand, f"`memagent {name}` declares typer parameters by hand: {by_hand}"
    cls = getattr(callback, "options_type", None)
    assert cls is not None and dataclasses.is_dataclass(cls), \
        f"`memagent {name}` is not made by options_command from an option dataclass"
    fields = {flag_key(f) for f, _ in flag_fields(cls)}
    params = {p.name for p in _click(name).params if p.name != "help"}
    assert params == fields, (name, params ^ fields)


def test_no_command_module_declares_a_typer_parameter_by_hand():
    """Only the generator (cli/params.py) builds typer.Option / typer.Argument."""
    for path in sorted((SRC / "cli").glob("*.py")):
        if path.name == "params.py":
            continue
        assert not re.search(r"typer\.(Option|Argument)\(", path.read_text()), path


def _option_names() -> set[str]:
    """The parameter names of every option of every command."""
    return {p.name for name in COMMANDS for p in _click(name).params if p.name != "help"}


def _names_in(node: ast.AST) -> set[str]:
    """String constants of a literal (dict keys, tuple/list/set items) that are option names."""
    if isinstance(node, ast.Dict):
        items = node.keys
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = node.elts
    else:
        return set()
    return {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}


def test_no_rule_is_keyed_by_option_name():
    """flags.py and the command modules hold no module-level table of option names (the old POSITIVE_INTS,
    NON_NEGATIVE_INTS, CHOICES, MAXIMA, FIELD_RULES), and their code compares no value's name with an option
    name (the old `if name == "seed"`, `if name == "device"`): a rule is in the field's metadata only."""
    options = _option_names()
    for path in [SRC / "flags.py", *sorted((SRC / "cli").glob("*.py"))]:
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                keyed = _names_in(node.value) & options
                assert len(keyed) < 2, f"{path.name}:{node.lineno} keys rules by option name: {sorted(keyed)}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                consts = {c.value for c in [node.left, *node.comparators]
                          if isinstance(c, ast.Constant) and isinstance(c.value, str)}
                consts |= {v for c in node.comparators for v in _names_in(c)}
                names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                assert not (consts & options and names & {"name", "key", "param"}), \
                    f"{path.name}:{node.lineno} checks an option by its name"
    import memagent.flags as flags

    assert not hasattr(flags, "check_flags")


def test_each_rule_sits_beside_its_field_and_one_checker_applies_it():
    """Every option with a rule refuses a value past it through check_options alone (the field's metadata)."""
    checked = 0
    for cb in COMMANDS.values():
        cls = cb.options_type
        for f, kind in flag_fields(cls):
            limits = f.metadata.get("rule") or {}
            if "min" not in limits:
                continue
            owner = next(c for c in _groups(cls) if f in dataclasses.fields(c))
            bad = _required(owner, {f.name: limits["min"] - 1})
            with pytest.raises(InputError, match=re.escape(flag_decls(f)[0])):
                check_options(bad)
            checked += 1
    assert checked >= 20


def _groups(cls: type):
    """`cls` and its nested option groups."""
    yield cls
    for f in dataclasses.fields(cls):
        if isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory):
            yield from _groups(f.default_factory)


def _required(cls: type, values: dict) -> object:
    """An object of `cls`'s fields (required ones filled in, `values` set) built without running __init__."""
    obj = object.__new__(cls)
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            value = None
        object.__setattr__(obj, f.name, values.get(f.name, value))
    return obj


def test_the_written_out_option_classes_hold_every_agent_field_of_their_section():
    """BudgetOptions / SamplingOptions (the flags) and the profile's Prompts / Sampling / Budgets are plain
    dataclasses; each holds, in AgentConfig's order, the AgentConfig fields of its section (with a `cli` help for
    a flag), their rules and help copied from AgentConfig (declared once, there)."""
    from memagent.config import AgentConfig
    from memagent.flags import BudgetOptions, SamplingOptions
    from memagent.protocol.profile import Budgets, Prompts, Sampling

    def of(section, cli=False):
        return [f.name for f in dataclasses.fields(AgentConfig)
                if f.metadata.get("section") == section and (f.metadata.get("cli") or not cli)]

    names = lambda cls: [f.name for f in dataclasses.fields(cls)]  # noqa: E731
    assert names(BudgetOptions) == of("budgets", cli=True) == ["chunk_tokens", "memory_tokens", "answer_tokens",
                                                                "query_tokens"]
    assert names(SamplingOptions) == of("sampling", cli=True) == ["temperature", "top_p", "seed"]
    assert names(Prompts)[:-1] == of("prompts") and names(Sampling)[:-1] == of("sampling")
    assert names(Budgets)[:5] == of("budgets")
    agent = {f.name: f for f in dataclasses.fields(AgentConfig)}
    for cls in (Prompts, Sampling, Budgets):
        for f in dataclasses.fields(cls):
            if f.name in agent:
                assert f.default == agent[f.name].default and f.metadata == agent[f.name].metadata
    assert dataclasses.fields(BudgetOptions)[0].metadata["rule"] == {"min": 1}  # the rule beside the field
