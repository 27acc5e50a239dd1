"""Protocol profiles: one YAML file holds every setting that changes a score.

A profile has a name, four sections and one mapping (see `configs/profiles/memagent.yaml`, the project's
own profile, equal to `Profile()`):

    prompts:   memory_template, final_template, empty_memory, baseline_template,
               answer_protocol (boxed | phrase), think (strip | keep)
    sampling:  temperature, top_p, seed, repeats
    budgets:   chunk_tokens, memory_tokens, answer_tokens, query_tokens, document_tokens,
               baseline_answer_tokens, baseline_window, yarn_factor
    scoring:   golds (all | first), empty (zero | text), failed (wrong | skip)
    chat_template_kwargs: {name: value} passed to the chat template (e.g. enable_thinking: false)
    workflow:  name (a registered reading workflow: memagent | lookup | skim | a plug-in's), options (its own)

A file may give any subset; the rest keeps the base profile's values (the built-in defaults).
Unknown keys are refused with the list of valid ones; numbers must be finite and of the right
type. Command-line flags override a profile (`apply_flags`), and the resolved profile is written
next to every result (`write_profile`).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from memagent.config import AgentConfig, ConfigError
from memagent.eval.baselines import BASELINE_TEMPLATE, check_baseline_template
from memagent.eval.scoring import ScoreOptions, ScoringError

if TYPE_CHECKING:
    from memagent.backends.base import Backend
    from memagent.backends.options import BackendOptions

PROFILE_FILE = "profile.yaml"
SEED_LIMIT = 2**32  # NumPy's seeds; the --seed flag has the same bound (memagent.flags)
# names `apply_chat_template` (or the template's own render call) takes itself: a kwarg of that name would replace
# the conversation, tokenize the prompt, ... or fail with "multiple values for keyword argument"
RESERVED_TEMPLATE_KWARGS = (
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs", "kwargs", "raise_exception", "strftime_now",
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
    "additional_special_tokens",
)
TEMPLATE_KWARGS_MAX_DEPTH = 8  # enable_thinking: false is depth 1; a nested option list depth 3
TEMPLATE_KWARGS_MAX_ITEMS = 1000  # values (scalars, list items, mapping entries) in all
TEMPLATE_KWARGS_MAX_CHARS = 65536  # characters of all strings together


@dataclass(frozen=True)
class Prompts:
    memory_template: str = AgentConfig.memory_template
    final_template: str = AgentConfig.final_template
    empty_memory: str = AgentConfig.empty_memory  # the memory before the first chunk
    baseline_template: str = BASELINE_TEMPLATE  # full-context and rag-bm25: {question} and {context}
    answer_protocol: str = "boxed"  # "boxed": last \\boxed{}; "phrase": text after the last "the answer is"
    think: str = "strip"  # "strip": drop each reply up to its last </think>; "keep": use replies as they are


@dataclass(frozen=True)
class Sampling:
    temperature: float = AgentConfig.temperature  # 0 = greedy (ours); the reference evaluation samples at 0.7
    top_p: float = AgentConfig.top_p  # the reference evaluation: 0.95
    seed: int | None = None  # base seed; repeat r of a sample uses its own seed derived from it
    repeats: int = 1  # runs of every sample (eval --repeats); tables show mean ± standard error


@dataclass(frozen=True)
class Budgets:
    chunk_tokens: int = AgentConfig.chunk_tokens  # C: document tokens per memory call (the paper's defaults)
    memory_tokens: int = AgentConfig.memory_tokens  # M: cap on the memory (and max new tokens of a memory call)
    answer_tokens: int = AgentConfig.answer_tokens  # max new tokens of MemAgent's final answer
    query_tokens: int = AgentConfig.query_tokens  # budget of the question
    document_tokens: int | None = None  # MemAgent: cut longer documents in the middle (reference eval: 120000)
    baseline_answer_tokens: int | None = None  # baselines' max new tokens; None: answer_tokens (reference: 10000)
    baseline_window: int | None = None  # baselines' window; None: the model's (reference: 120000; 990000 with YaRN)
    yarn_factor: float | None = None  # YaRN rope scaling of the model (transformers, vllm backends)


@dataclass(frozen=True)
class WorkflowChoice:
    """The reading workflow a score was made with (memagent.agent.registry), and its own options."""
    name: str = "memagent"  # the paper's overwrite loop
    options: dict[str, Any] = field(default_factory=dict)  # keyword options of its factory (e.g. lookup's)


@dataclass(frozen=True)
class Profile:
    name: str = "memagent"
    prompts: Prompts = field(default_factory=Prompts)
    sampling: Sampling = field(default_factory=Sampling)
    budgets: Budgets = field(default_factory=Budgets)
    scoring: ScoreOptions = field(default_factory=ScoreOptions)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    workflow: WorkflowChoice = field(default_factory=WorkflowChoice)

    def __post_init__(self) -> None:
        self.agent_config()  # templates, budgets, protocol: AgentConfig's own checks
        try:
            check_baseline_template(self.prompts.baseline_template)
        except ValueError as e:
            raise ConfigError(f"prompts.baseline_template: {e}") from None
        s, b = self.sampling, self.budgets
        if s.repeats < 1:
            raise ConfigError(f"sampling.repeats must be at least 1, got {s.repeats}")
        for key in ("baseline_answer_tokens", "baseline_window"):
            if getattr(b, key) is not None and getattr(b, key) <= 0:
                raise ConfigError(f"budgets.{key} must be a positive integer or null, got {getattr(b, key)}")
        if b.yarn_factor is not None and not b.yarn_factor > 1:
            raise ConfigError(f"budgets.yarn_factor must be > 1 (it multiplies the trained window) or null, "
                              f"got {b.yarn_factor}")
        if s.seed is not None and not 0 <= s.seed < SEED_LIMIT:  # the same rule as the --seed flag
            raise ConfigError(f"sampling.seed must be in [0, 2**32) (NumPy's limit) or null, got "
                              f"{s.seed if abs(s.seed) < 10**30 else f'an integer of {s.seed.bit_length()} bits'}")
        check_template_kwargs(self.chat_template_kwargs)
        _check_workflow(self.workflow)

    def agent_config(self, **extra: Any) -> AgentConfig:
        """The read-write loop's settings; `extra` sets AgentConfig fields a profile does not hold."""
        p, s, b = self.prompts, self.sampling, self.budgets
        return AgentConfig(
            chunk_tokens=b.chunk_tokens, memory_tokens=b.memory_tokens, answer_tokens=b.answer_tokens,
            query_tokens=b.query_tokens, memory_template=p.memory_template, final_template=p.final_template,
            empty_memory=p.empty_memory, temperature=s.temperature, top_p=s.top_p, seed=s.seed,
            answer_protocol=p.answer_protocol, think=p.think, document_tokens=b.document_tokens, **extra)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_SECTIONS = {"prompts": Prompts, "sampling": Sampling, "budgets": Budgets, "scoring": ScoreOptions}
_TOP = ("name", *_SECTIONS, "chat_template_kwargs", "workflow")


def _check_workflow(choice: WorkflowChoice) -> None:
    """A workflow name the registry knows (built in, registered or installed), options a mapping of names."""
    from memagent.agent.registry import UnknownWorkflow, get_workflow

    if not isinstance(choice.name, str):
        raise ConfigError(f"workflow.name must be a string, got {choice.name!r}")
    try:
        get_workflow(choice.name)
    except UnknownWorkflow as e:
        raise ConfigError(f"workflow.name: {e}") from None
    opts = choice.options
    if not isinstance(opts, dict) or not all(isinstance(k, str) for k in opts):
        raise ConfigError(f"workflow.options must be a mapping of option names to values, got {opts!r}")


def _workflow_section(data: Any, base: WorkflowChoice) -> WorkflowChoice:
    """`base` with the keys of a profile's `workflow` mapping set (`name`, `options`; null options: none)."""
    if not isinstance(data, dict):
        raise ConfigError(f"workflow must be a mapping with keys name, options; got {type(data).__name__}")
    unknown = sorted(set(data) - {"name", "options"})
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(f'workflow.{k}' for k in unknown)}; "
                          "valid keys of workflow: name, options")
    name = _check_value("workflow.name", data["name"], "", False) if "name" in data else base.name
    options = data.get("options", base.options)
    return WorkflowChoice(name=name, options={} if options is None else options)


def check_template_kwargs(kwargs: dict[str, Any]) -> None:
    """Refuse chat template arguments that are not plain data of bounded size, or that collide with the names
    `apply_chat_template` takes itself (RESERVED_TEMPLATE_KWARGS): JSON scalars (finite numbers, integers
    within 64 bits), lists and string-keyed mappings, at most TEMPLATE_KWARGS_MAX_DEPTH deep,
    TEMPLATE_KWARGS_MAX_ITEMS values and TEMPLATE_KWARGS_MAX_CHARS characters; a recursive value (a YAML
    alias of itself) is refused as too deep."""
    clash = [k for k in kwargs if k in RESERVED_TEMPLATE_KWARGS]
    if clash:
        raise ConfigError(f"chat_template_kwargs: {', '.join(clash)} {'is an argument' if len(clash) == 1 else 'are arguments'} "
                          "of apply_chat_template itself, not a template variable; remove "
                          f"{'it' if len(clash) == 1 else 'them'} (reserved: {', '.join(RESERVED_TEMPLATE_KWARGS)})")
    budget = {"items": TEMPLATE_KWARGS_MAX_ITEMS, "chars": TEMPLATE_KWARGS_MAX_CHARS}
    stack: list[tuple[str, Any, int]] = [(f"chat_template_kwargs.{k}", v, 1) for k, v in kwargs.items()]
    while stack:  # iterative, so a deep or recursive value cannot hit Python's recursion limit
        where, value, depth = stack.pop()
        budget["items"] -= 1
        if depth > TEMPLATE_KWARGS_MAX_DEPTH:
            raise ConfigError(f"{where}: nested more than {TEMPLATE_KWARGS_MAX_DEPTH} deep (or refers to itself); "
                              "give plain values, lists or mappings")
        if budget["items"] < 0:
            raise ConfigError(f"chat_template_kwargs holds more than {TEMPLATE_KWARGS_MAX_ITEMS} values; "
                              "a template needs a few flags")
        if isinstance(value, dict):
            if not all(isinstance(k, str) for k in value):
                raise ConfigError(f"{where}: mapping keys must be strings")
            stack.extend((f"{where}.{k}", v, depth + 1) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", v, depth + 1) for i, v in enumerate(value))
        elif isinstance(value, str):
            budget["chars"] -= len(value)
            if budget["chars"] < 0:
                raise ConfigError(f"chat_template_kwargs holds more than {TEMPLATE_KWARGS_MAX_CHARS} characters "
                                  "of text; a template needs a few flags")
        elif isinstance(value, bool) or value is None:
            pass
        elif isinstance(value, int):
            if not -2**63 <= value < 2**63:
                raise ConfigError(f"{where}: the integer is out of the 64-bit range")
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise ConfigError(f"{where}: must be a finite number, got {value!r}")
        else:
            raise ConfigError(f"{where}: must be a string, number, boolean, null, list or mapping, got "
                              f"{type(value).__name__} (a YAML tag?)")


def _check_value(key: str, value: Any, default: Any, optional: bool) -> Any:
    """`value` if it has the type of `default` (int for float allowed; None when optional), finite."""
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{key} must not be null")
    kind = type(default) if default is not None else None
    if key.endswith("yarn_factor") or kind is float:
        ok, want = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
        value = float(value) if ok else value
    elif kind is str:
        ok, want = isinstance(value, str), "a string"
    else:  # int (or an optional int)
        ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
    if not ok:
        raise ConfigError(f"{key} must be {want}{' or null' if optional else ''}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number, got {value!r}")
    return value


def _section(name: str, cls: type, data: Any, base: Any) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{name} must be a mapping of settings, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(f'{name}.{k}' for k in unknown)}; "
                          f"valid keys of {name}: {', '.join(fields)}")
    values = {}
    for key, value in data.items():
        default = getattr(cls(), key)
        optional = "None" in str(fields[key].type)
        values[key] = _check_value(f"{name}.{key}", value, default, optional)
    try:
        return dataclasses.replace(base, **values)
    except ScoringError as e:
        raise ConfigError(str(e)) from None


def profile_from_dict(data: Any, base: Profile | None = None, source: str = "profile") -> Profile:
    """`base` (default: the built-in profile) with the settings of `data` (a nested mapping) applied."""
    base = base or Profile()
    if data is None:
        return base
    if not isinstance(data, dict):
        raise ConfigError(f"{source} must be a mapping with sections {', '.join(_TOP)}; got {type(data).__name__}")
    unknown = sorted(set(data) - set(_TOP))
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(_TOP)}")
    values: dict[str, Any] = {}
    for name, cls in _SECTIONS.items():
        if name in data:
            values[name] = _section(name, cls, data[name], getattr(base, name))
    if "name" in data:
        values["name"] = _check_value("name", data["name"], "", False)
    if "chat_template_kwargs" in data:
        kwargs = data["chat_template_kwargs"]
        if kwargs is None:
            kwargs = {}
        if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise ConfigError(f"chat_template_kwargs must be a mapping of names to values, got "
                              f"{type(kwargs).__name__}")
        values["chat_template_kwargs"] = dict(kwargs)
    if "workflow" in data:
        values["workflow"] = _workflow_section(data["workflow"], base.workflow)
    try:
        return dataclasses.replace(base, **values)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def load_profile(path: str | Path, base: Profile | None = None) -> Profile:
    """The profile in YAML file `path`, over `base` (default: the built-in profile)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"profile file {p} does not exist; pass a YAML profile (e.g. configs/profiles/memagent.yaml)")
    from memagent.bounded import load_yaml  # depth, size, aliases bounded; no tags (memagent.bounded)

    try:
        data = load_yaml(p.read_text(encoding="utf-8"), str(p), ConfigError)
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p} is not valid YAML: {e}") from None
    return profile_from_dict(data, base, source=str(p))


# flag name -> (section, key): the command-line options that override a profile setting
FLAG_KEYS = {
    "chunk_tokens": ("budgets", "chunk_tokens"), "memory_tokens": ("budgets", "memory_tokens"),
    "answer_tokens": ("budgets", "answer_tokens"), "query_tokens": ("budgets", "query_tokens"),
    "window": ("budgets", "baseline_window"), "temperature": ("sampling", "temperature"),
    "top_p": ("sampling", "top_p"), "seed": ("sampling", "seed"), "repeats": ("sampling", "repeats"),
    "golds": ("scoring", "golds"), "empty_prediction": ("scoring", "empty"), "failed": ("scoring", "failed"),
    "workflow": ("workflow", "name"),
}


def apply_flags(profile: Profile, **flags: Any) -> Profile:
    """`profile` with every flag that was given (not None) set; flags are the keys of FLAG_KEYS."""
    data: dict[str, dict[str, Any]] = {}
    for flag, value in flags.items():
        if flag not in FLAG_KEYS:
            raise ConfigError(f"no profile setting for flag {flag!r}; known: {', '.join(FLAG_KEYS)}")
        if value is not None:
            section, key = FLAG_KEYS[flag]
            data.setdefault(section, {})[key] = value
    return profile_from_dict(data, profile, source="command-line flags") if data else profile


def resolve_profile(path: str | Path | None, base: Profile | None = None, **flags: Any) -> Profile:
    """The settings a command runs with: `base` (built-in), then the profile file, then the flags."""
    profile = load_profile(path, base) if path is not None else (base or Profile())
    return apply_flags(profile, **flags)


def open_backend(model: str, options: "BackendOptions", profile: Profile) -> "Backend":
    """The backend of `ask`, `eval` and `serve`: the command's backend options, with the profile's chat
    template arguments and YaRN factor."""
    return dataclasses.replace(options, chat_template_kwargs=profile.chat_template_kwargs,
                               yarn_factor=profile.budgets.yarn_factor).load(model)


# AgentConfig fields a profile sets for training rollouts (sampling stays the training config's:
# rollouts sample at their own temperature, 1.0 in the paper)
_TRAIN_FIELDS = ("chunk_tokens", "memory_tokens", "answer_tokens", "query_tokens", "memory_template",
                 "final_template", "empty_memory", "answer_protocol", "think", "document_tokens")


def train_config_with_profile(cfg: Any, profile: Profile | None, keep: set[str] | frozenset[str] = frozenset()) -> tuple[Any, Profile]:
    """(training config with the profile's prompts and budgets in `cfg.agent`, the profile it runs with).

    cfg: a `memagent.rl.config.TrainConfig`; keep: AgentConfig fields set by explicit `agent.*=...`
    overrides, which win over the profile. The returned profile describes what the run uses
    (its sampling section is the rollouts').
    """
    agent = cfg.agent
    if profile is not None:
        wanted = profile.agent_config()
        agent = dataclasses.replace(agent, **{k: getattr(wanted, k) for k in _TRAIN_FIELDS if k not in keep})
        cfg = dataclasses.replace(cfg, agent=agent)
        if profile.chat_template_kwargs and not cfg.chat_template_kwargs:  # the config's own, if set, win
            cfg = dataclasses.replace(cfg, chat_template_kwargs=dict(profile.chat_template_kwargs))
    base = profile or Profile()
    resolved = dataclasses.replace(
        base, chat_template_kwargs=dict(cfg.chat_template_kwargs),
        prompts=dataclasses.replace(base.prompts, memory_template=agent.memory_template,
                                    final_template=agent.final_template, empty_memory=agent.empty_memory,
                                    answer_protocol=agent.answer_protocol, think=agent.think),
        sampling=dataclasses.replace(base.sampling, temperature=agent.temperature, top_p=agent.top_p, seed=agent.seed),
        budgets=dataclasses.replace(base.budgets, chunk_tokens=agent.chunk_tokens, memory_tokens=agent.memory_tokens,
                                    answer_tokens=agent.answer_tokens, query_tokens=agent.query_tokens,
                                    document_tokens=agent.document_tokens))
    return cfg, resolved


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (templates) as readable literal blocks."""


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _str)


def dump_profile(profile: Profile) -> str:
    return yaml.dump(profile.to_dict(), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1000)


def write_profile(profile: Profile, path: str | Path) -> Path:
    """Write `profile` as YAML to `path` (a file, or a folder to hold `profile.yaml`); returns the file."""
    p = Path(path)
    if p.is_dir():
        p = p / PROFILE_FILE
    from memagent.io import atomic_write_text

    atomic_write_text(p, dump_profile(profile))
    return p
