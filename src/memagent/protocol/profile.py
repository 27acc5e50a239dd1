"""Protocol profiles: one YAML file holds every setting that changes a score.

A profile has a name, four sections and one mapping (see `configs/profiles/memagent.yaml`, the project's
own profile, equal to `Profile()`):

    prompts:   memory_template, final_template, empty_memory, answer_protocol (boxed | phrase),
               think (strip | keep), baseline_template
    sampling:  temperature, top_p, seed, repeats
    budgets:   chunk_tokens, memory_tokens, answer_tokens, query_tokens, document_tokens,
               baseline_answer_tokens, baseline_window, yarn_factor
    scoring:   golds (all | first), empty (zero | text), failed (wrong | skip)
    chat_template_kwargs: {name: value} passed to the chat template (e.g. enable_thinking: false)
    speculate: none | ngram, speculative decoding of the transformers and vllm backends (--speculate overrides it)
    workflow:  name (a registered reading workflow: memagent | lookup | skim | a plug-in's), options (its own);
               the older `workflow: NAME` and `workflow: {NAME: options}` read with a deprecation line
    reward:    the outcome reward training scores the final answer with (memagent.rewards: boxed, em, f1, judge, ...)
    step_reward: the step reward of each memory update ("" none, the paper; evidence, answer-recall, ...)

The prompts, sampling and budgets sections are AgentConfig's own fields (those it marks `section=...`, with
their types, defaults and rules, declared once in memagent.config), plus the settings only a protocol has
(the baselines' template and budgets, YaRN, repeats). A file may give any subset; the rest keeps the base
profile's values (the built-in defaults). It is read by the one loader, memagent.sections: unknown keys are
refused with the list of valid ones; numbers must be finite and of the right type. Command-line flags
override a profile (`resolve_values`; which flag sets which key is read off the fields: `FLAG_KEYS`), and the
resolved profile is written next to every result (`write_profile`).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import yaml

from memagent.backends.speculate import check_speculate
from memagent.bounded import load_yaml
from memagent.config import AgentConfig, ConfigError, WorkflowChoice, hints_of, workflow_choice_data
from memagent.eval.baselines import BASELINE_TEMPLATE, check_baseline_template
from memagent.eval.scoring import ScoreOptions
from memagent.errors import MemAgentError
from memagent.io import atomic_write_text
from memagent.rewards.registry import DEFAULT_REWARD
from memagent.sections import check_fields, coerce, copy_field, rule

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


class _Section:
    """A profile's section (a frozen dataclass): its fields' rules checked as it is built, a broken one named
    SECTION.field."""

    SECTION = ""

    def __post_init__(self) -> None:
        check_fields(self, self.SECTION)


@dataclass(frozen=True)
class Prompts(_Section):
    """The prompts: AgentConfig's templates, answer protocol and think mode, and the baselines' template."""

    SECTION = "prompts"

    memory_template: str = copy_field(AgentConfig, "memory_template")
    final_template: str = copy_field(AgentConfig, "final_template")
    empty_memory: str = copy_field(AgentConfig, "empty_memory")
    answer_protocol: str = copy_field(AgentConfig, "answer_protocol")
    think: str = copy_field(AgentConfig, "think")
    baseline_template: str = BASELINE_TEMPLATE  # full-context and rag-bm25: {question}, {context}


@dataclass(frozen=True)
class Sampling(_Section):
    """How replies are sampled: AgentConfig's temperature, top_p and seed, and the repeats of every sample."""

    SECTION = "sampling"

    temperature: float = copy_field(AgentConfig, "temperature")
    top_p: float = copy_field(AgentConfig, "top_p")
    seed: Optional[int] = copy_field(AgentConfig, "seed")
    # runs of every sample (eval --repeats); tables show mean ± standard error
    repeats: int = field(default=1, metadata=rule(min=1, flag_name="repeats"))


@dataclass(frozen=True)
class Budgets(_Section):
    """The token budgets: AgentConfig's, and the baselines' answer and window budgets and YaRN."""

    SECTION = "budgets"

    chunk_tokens: int = copy_field(AgentConfig, "chunk_tokens")
    memory_tokens: int = copy_field(AgentConfig, "memory_tokens")
    answer_tokens: int = copy_field(AgentConfig, "answer_tokens")
    query_tokens: int = copy_field(AgentConfig, "query_tokens")
    document_tokens: Optional[int] = copy_field(AgentConfig, "document_tokens")
    # baselines' max new tokens; None: answer_tokens (reference: 10000)
    baseline_answer_tokens: Optional[int] = field(default=None, metadata=rule(min=1))
    # baselines' window; None: the model's (reference: 120000; 990000 with YaRN); flag --window
    baseline_window: Optional[int] = field(default=None, metadata=rule(min=1, flag_name="window"))
    # YaRN rope scaling of the model (transformers, vllm backends); it multiplies the trained window
    yarn_factor: Optional[float] = field(default=None, metadata=rule(above=1))


def agent_fields(values: dict[str, Any]) -> dict[str, Any]:
    """The AgentConfig fields of a profile's fields (`profile_values`, or a Profile's)."""
    p, s, b = values["prompts"], values["sampling"], values["budgets"]
    return dict(
        chunk_tokens=b.chunk_tokens, memory_tokens=b.memory_tokens, answer_tokens=b.answer_tokens,
        query_tokens=b.query_tokens, memory_template=p.memory_template, final_template=p.final_template,
        empty_memory=p.empty_memory, temperature=s.temperature, top_p=s.top_p, seed=s.seed,
        answer_protocol=p.answer_protocol, think=p.think, document_tokens=b.document_tokens)


# AgentConfig fields a profile sets for training rollouts: its prompts and budgets (not its sampling)
TRAIN_FIELDS = tuple(f.name for f in dataclasses.fields(AgentConfig) if f.metadata.get("section") in ("prompts", "budgets"))


@dataclass(frozen=True)
class Profile:
    name: str = "memagent"
    prompts: Prompts = field(default_factory=Prompts)
    sampling: Sampling = field(default_factory=Sampling)
    budgets: Budgets = field(default_factory=Budgets)
    scoring: ScoreOptions = field(default_factory=ScoreOptions, metadata={  # eval's own section: its flags
        "flags": {"golds": "golds", "empty": "empty_prediction", "failed": "failed"}})
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    workflow: WorkflowChoice = field(default_factory=WorkflowChoice)
    reward: str = DEFAULT_REWARD  # training's outcome reward (a training config's own `reward`, when set, wins)
    step_reward: str = ""  # training's step reward; "" = none (the paper's final-answer reward alone)
    speculate: str = "none"  # none | ngram (memagent.backends.speculate): greedy replies unchanged, only faster

    def __post_init__(self) -> None:
        """The file's own rules; the names it gives (workflow, rewards) are looked up by the command that runs
        them, once (memagent.agent.registry.bind_workflow, memagent.rewards), not here."""
        AgentConfig(**self._agent_fields())  # templates, budgets, protocol: AgentConfig's own checks
        try:
            check_speculate(self.speculate)
        except ValueError as e:
            raise ConfigError(f"speculate: {e}") from None
        try:
            check_baseline_template(self.prompts.baseline_template)
        except ValueError as e:
            raise ConfigError(f"prompts.baseline_template: {e}") from None
        seed = self.sampling.seed
        if seed is not None and not 0 <= seed < SEED_LIMIT:  # the same rule as the --seed flag
            raise ConfigError(f"sampling.seed must be in [0, 2**32) (NumPy's limit) or null, got "
                              f"{seed if abs(seed) < 10**30 else f'an integer of {seed.bit_length()} bits'}")
        check_template_kwargs(self.chat_template_kwargs)

    def agent_config(self, **extra: Any) -> AgentConfig:
        """The read-write loop's settings; `extra` sets AgentConfig fields a profile does not hold. A command
        builds it once and passes it on."""
        return AgentConfig(**self._agent_fields(), **extra)

    def _agent_fields(self) -> dict[str, Any]:
        return agent_fields(_fields(self))

    def training_agent(self, agent: AgentConfig, keep: set[str] | frozenset[str] = frozenset()) -> AgentConfig:
        """`training_agent(this profile's fields, agent, keep)`."""
        return training_agent(_fields(self), agent, keep)

    def training_rewards(self, reward: str, step_reward: str) -> dict[str, str]:
        """`training_rewards(this profile's fields, reward, step_reward)`."""
        return training_rewards(_fields(self), reward, step_reward)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def profile_flags() -> dict[str, tuple[str, str]]:
    """{flag name: (section, key)}: the command-line options that override a profile setting, read off the
    sections' fields (AgentConfig's fields with a `cli` help, `rule(flag_name=...)`, a section's `flags`)."""
    out: dict[str, tuple[str, str]] = {}
    for sec in dataclasses.fields(Profile):
        out.update({flag: (sec.name, key) for key, flag in sec.metadata.get("flags", {}).items()})
        section = getattr(Profile(), sec.name)
        if not dataclasses.is_dataclass(section):
            continue
        for f in dataclasses.fields(section):
            flag = f.metadata.get("flag_name") or (f.name if f.metadata.get("cli") else None)
            if flag:
                out[flag] = (sec.name, f.name)
    return out


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


def profile_values(data: Any, values: dict[str, Any] | None = None, source: str = "profile") -> dict[str, Any]:
    """The fields of a profile (default: the built-in's) with the settings of `data` (a nested mapping, one
    layer: memagent.json, a file, the flags) applied, each checked as it is read (unknown keys, types, each
    section's own rules) and named by `source`; the old spellings of the workflow choice read with a
    deprecation line (memagent.config.workflow_choice_data). `Profile(**values)` makes the profile, once."""
    values = dict(values) if values is not None else {f.name: getattr(BUILT_IN, f.name) for f in dataclasses.fields(Profile)}
    data = workflow_choice_data(data, source)  # its errors name `source` already
    if data is None:
        return values
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the profile must be a mapping of {', '.join(values)}; got {type(data).__name__}")
    unknown = sorted(str(k) for k in data if k not in values)
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(values)}")
    hints = hints_of(Profile)
    try:
        for name, value in data.items():
            values[name] = coerce(hints[name], value, name, values[name])
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    except MemAgentError as e:  # a section's own error type (e.g. eval's ScoringError)
        raise ConfigError(f"{source}: {e}") from None
    return values


def make_profile(values: dict[str, Any], sources: str = "profile") -> Profile:
    """The profile of `values` (`profile_values`' fields), checked as a whole once (`Profile.__post_init__`);
    an error names the `sources` its settings came from."""
    try:
        return Profile(**values)
    except ConfigError as e:
        raise ConfigError(f"{sources}: {e}") from None
    except MemAgentError as e:
        raise ConfigError(f"{sources}: {e}") from None


def profile_from_dict(data: Any, base: Profile | None = None, source: str = "profile") -> Profile:
    """`base` (default: the built-in profile) with the settings of `data` (a nested mapping) applied."""
    values = profile_values(data, None if base is None else _fields(base), source)
    return make_profile(values, source)


def _fields(profile: Profile) -> dict[str, Any]:
    return {f.name: getattr(profile, f.name) for f in dataclasses.fields(Profile)}


def read_profile_file(path: str | Path) -> Any:
    """The mapping of a YAML profile file (bounded: memagent.bounded), not yet checked."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"profile file {p} does not exist; pass a YAML profile (e.g. configs/profiles/memagent.yaml)")
    try:
        return load_yaml(p.read_text(encoding="utf-8"), str(p), ConfigError)  # bounded: memagent.bounded
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p} is not valid YAML: {e}") from None


def load_profile(path: str | Path, base: Profile | None = None) -> Profile:
    """The profile in YAML file `path`, over `base` (default: the built-in profile)."""
    return profile_from_dict(read_profile_file(path), base, source=str(path))


FLAG_KEYS = profile_flags()  # flag name -> (section, key), derived from the sections' fields


def flag_data(current: WorkflowChoice, **flags: Any) -> dict[str, dict[str, Any]]:
    """The nested mapping of every flag that was given (not None); flags are the keys of FLAG_KEYS. A flag that
    names another workflow than `current` leaves that one's options behind."""
    data: dict[str, dict[str, Any]] = {}
    for flag, value in flags.items():
        if flag not in FLAG_KEYS:
            raise ConfigError(f"no profile setting for flag {flag!r}; known: {', '.join(FLAG_KEYS)}")
        if value is not None:
            section, key = FLAG_KEYS[flag]
            data.setdefault(section, {})[key] = value
    if data.get("workflow", {}).get("name", current.name) != current.name:
        data["workflow"].setdefault("options", {})  # another workflow: the profile's options are not its
    return data


def resolve_values(path: str | Path | None, layers: list[tuple[str, Any]] = (), **flags: Any) -> tuple[dict[str, Any], str]:
    """(the fields of the profile a command runs with, where they came from): the built-in profile, then each
    (source, data) of `layers` (e.g. the model's memagent.json), the profile file `path`, then the flags. Each
    layer is checked as it is read; `make_profile` builds the profile, once."""
    values, sources = profile_values(None), ["the built-in profile"]
    for source, data in [*layers, *([(str(path), read_profile_file(path))] if path is not None else [])]:
        values = profile_values(data, values, source)
        sources.append(source)
    data = flag_data(values["workflow"], **flags)
    if data:
        values = profile_values(data, values, "command-line flags")
        sources.append("command-line flags")
    return values, ", ".join(sources)


def open_backend(model: str, options: "BackendOptions", profile: Profile) -> "Backend":
    """The backend of `ask`, `eval` and `serve`: the command's backend options, with the profile's chat
    template arguments and YaRN factor, and its speculation unless --speculate was given."""
    return dataclasses.replace(options, chat_template_kwargs=profile.chat_template_kwargs,
                               yarn_factor=profile.budgets.yarn_factor,
                               speculate=options.speculate or profile.speculate).load(model)


def training_agent(values: dict[str, Any], agent: AgentConfig,
                   keep: set[str] | frozenset[str] = frozenset()) -> AgentConfig:
    """`agent` (a training config's rollout workflow) with the prompts and budgets of a profile's fields
    (`values`), except the fields in `keep` (set by explicit `agent.*=...` overrides). Sampling stays the
    training config's: rollouts sample at their own temperature (1.0 in the paper)."""
    wanted = agent_fields(values)
    return dataclasses.replace(agent, **{k: wanted[k] for k in TRAIN_FIELDS if k not in keep})


def training_rewards(values: dict[str, Any], reward: str, step_reward: str) -> dict[str, str]:
    """A profile's `reward` and `step_reward` (of its fields `values`) for a training config whose own are
    `reward` and `step_reward`: only those the config leaves at their defaults (a config's own names win)."""
    out = {}
    if reward == DEFAULT_REWARD:
        out["reward"] = values["reward"]
    if not step_reward:
        out["step_reward"] = values["step_reward"]
    return out


def training_profile(cfg: Any, profile: Profile | None) -> dict[str, Any]:
    """The fields of the profile a training run uses (`dump_profile` writes them to its out_dir/profile.yaml):
    `profile` (default: the built-in) with the rollouts' prompts, budgets, sampling and chat template arguments
    of `cfg` (a TrainConfig). Both were checked as they were built; nothing is built or checked again."""
    agent, base = cfg.agent, _fields(profile or BUILT_IN)
    settings: dict[str, dict[str, Any]] = {}  # section -> {AgentConfig field: the rollouts' value}
    for f in dataclasses.fields(AgentConfig):
        if f.metadata.get("section"):
            settings.setdefault(f.metadata["section"], {})[f.name] = getattr(agent, f.name)
    sections = {name: dataclasses.replace(base[name], **values) for name, values in settings.items()}
    return {**base, "chat_template_kwargs": dict(cfg.chat_template_kwargs), **sections, "reward": cfg.reward,
            "step_reward": cfg.step_reward}


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (templates) as readable literal blocks."""


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _str)


def dump_profile(profile: Profile | dict[str, Any]) -> str:
    """`profile` (or a profile's fields, e.g. `training_profile`'s) as YAML, the sections in their order."""
    data = profile.to_dict() if isinstance(profile, Profile) else {
        k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in profile.items()}
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1000)


def write_profile(profile: Profile, path: str | Path) -> Path:
    """Write `profile` as YAML to `path` (a file, or a folder to hold `profile.yaml`); returns the file."""
    p = Path(path)
    if p.is_dir():
        p = p / PROFILE_FILE
    atomic_write_text(p, dump_profile(profile))
    return p


BUILT_IN = Profile()  # the paper's settings, built once (its functions are all defined above)
