"""`memagent profile from-reference`: the official evaluation protocol as a profile, built from a
checkout of the official repository (github.com/BytedTsinghua-SIA/MemAgent) that the user has.

The prompt wording is not ours to ship, so it is read out of that checkout: each source file is
parsed with `ast` (never imported or run) and only top-level string assignments and
`int(os.getenv(NAME, DEFAULT))` settings are taken. What is read, per answer protocol:

    taskutils/memory_eval/utils/recurrent.py        TEMPLATE, TEMPLATE_FINAL, NO_MEMORY   (phrase)
    taskutils/memory_eval/utils/recurrent_boxed.py  TEMPLATE, TEMPLATE_FINAL, NO_MEMORY   (boxed)
    taskutils/memory_eval/utils/openai_api.py       template_0shot (baselines, phrase)
    taskutils/memory_eval/utils/boxed.py            template_0shot (baselines, boxed)
    taskutils/memory_eval/utils/envs.py             RECURRENT_CHUNK_SIZE, RECURRENT_MAX_NEW,
                                                    MAX_INPUT_LEN, MAX_OUTPUT_LEN

The settings that are facts of the official scripts, not strings in them, are set here
(docs/reproducing.md lists where each comes from): sampling at temperature 0.7 and top_p 0.95,
no seed, one repeat; the answer protocol of the run (Table 1's runs use the phrase protocol:
`--api recurrent` for MemAgent, `--api openai` for the baselines); the reply cut after its last
`</think>`; sub_em against the first gold only, an empty prediction scoring 0, failed requests
left out of the average; no document truncation for MemAgent (Table 1 sets its limit to 1e11);
baselines cut to MAX_INPUT_LEN prompt tokens and answering in up to MAX_OUTPUT_LEN tokens.
"""
from __future__ import annotations

import ast
import string
from pathlib import Path
from typing import Any

from memagent.config import AgentConfig, ConfigError
from memagent.io import OutputError, check_output_file
from memagent.protocol.profile import Profile, profile_from_dict

UTILS = "taskutils/memory_eval/utils"
FILES = {
    "phrase": (f"{UTILS}/recurrent.py", f"{UTILS}/openai_api.py"),
    "boxed": (f"{UTILS}/recurrent_boxed.py", f"{UTILS}/boxed.py"),
}
ENVS = f"{UTILS}/envs.py"
AGENT_NAMES = ("TEMPLATE", "TEMPLATE_FINAL", "NO_MEMORY")
BASELINE_NAMES = ("template_0shot",)
ENV_NAMES = ("RECURRENT_CHUNK_SIZE", "RECURRENT_MAX_NEW", "MAX_INPUT_LEN", "MAX_OUTPUT_LEN")
REPO = "github.com/BytedTsinghua-SIA/MemAgent"


class ReferenceError(ConfigError):
    """The given folder is not a checkout of the official repository in the shape this reads."""


def _getenv_default(node: ast.AST) -> Any:
    """DEFAULT of `int(os.getenv(NAME, DEFAULT))` or `os.getenv(NAME, DEFAULT)`, else raise ValueError."""
    cast = None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("int", "float", "str"):
        cast, node = node.func.id, node.args[0] if len(node.args) == 1 else None
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "getenv"
            and len(node.args) == 2):
        value = ast.literal_eval(node.args[1])
        return {"int": int, "float": float, "str": str, None: lambda v: v}[cast](value)
    raise ValueError("not a literal or an os.getenv setting")


def read_assignments(path: Path, names: tuple[str, ...]) -> dict[str, Any]:
    """The values of the top-level assignments `names` in Python file `path`, read with `ast`."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError) as e:
        raise ReferenceError(f"cannot parse {path}: {e}") from None
    found: dict[str, Any] = {}
    for stmt in tree.body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            continue
        name = stmt.targets[0].id
        if name not in names:
            continue
        try:
            found[name] = ast.literal_eval(stmt.value)
        except ValueError:
            try:
                found[name] = _getenv_default(stmt.value)
            except (ValueError, TypeError, IndexError):
                raise ReferenceError(f"{path}: {name} is not a literal value or an os.getenv(...) setting; "
                                     "this checkout differs from the shape this command reads") from None
    missing = [n for n in names if n not in found]
    if missing:
        raise ReferenceError(f"{path} does not assign {', '.join(missing)} (expected top-level assignments "
                             f"{', '.join(names)}); is it a checkout of {REPO}?")
    return found


def agent_template(text: Any, where: str, fields: dict[str, str]) -> str:
    """A `str.format` template (`{prompt}`, `{{`-escaped braces) turned into ours (`{question}`, plain braces)."""
    if not isinstance(text, str):
        raise ReferenceError(f"{where} is not a string")
    out = []
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as e:
        raise ReferenceError(f"{where} is not a format template: {e}") from None
    for literal, name, spec, conversion in parsed:
        out.append(literal)
        if name is None:
            continue
        if name not in fields or spec or conversion:
            raise ReferenceError(f"{where} has the placeholder {{{name}}}; expected only "
                                 + ", ".join("{" + f + "}" for f in fields))
        out.append("{" + fields[name] + "}")
    return "".join(out)


def baseline_template(text: Any, where: str) -> str:
    """The baselines' `$DOC$` / `$Q$` template (filled with str.replace, braces kept as written) as ours."""
    if not isinstance(text, str) or "$DOC$" not in text or "$Q$" not in text:
        raise ReferenceError(f"{where} must be a string holding $DOC$ and $Q$")
    return text.replace("$DOC$", "{context}").replace("$Q$", "{question}")


def _require(root: Path, rel: str, names: tuple[str, ...]) -> dict[str, Any]:
    path = root / rel
    if not path.is_file():
        raise ReferenceError(f"{root} lacks {rel} (expected {', '.join(names)} in it); pass the root of a "
                             f"checkout of {REPO}")
    return read_assignments(path, names)


def check_reference_out(root: str | Path, out: str | Path) -> Path:
    """Before reading: `out` (the profile to write) is a writable file outside the checkout at `root`; this
    command reads that checkout and never writes into it (an `--out TREE/.../envs.py` destroyed its source)."""
    p = check_output_file(out, "--out", {"the checkout": root})
    tree, target = Path(root).resolve(), p.resolve()
    if Path(root).is_dir() and (target == tree or tree in target.parents):
        raise OutputError(f"--out {out} is inside the reference checkout {root}, which this command reads and never "
                          "writes; write the profile elsewhere (e.g. configs/profiles/official.yaml)")
    return p


def profile_from_reference(root: str | Path, protocol: str = "phrase", baseline_input_tokens: int | None = None,
                           yarn_factor: float | None = None) -> Profile:
    """The official evaluation profile from the checkout at `root` (see the module docstring).

    protocol: "phrase" (Table 1's runs) or "boxed"; baseline_input_tokens: the baselines' prompt
    limit (default MAX_INPUT_LEN, 120000; the 1M-window models ran with 990000);
    yarn_factor: the model's YaRN rope scaling for the baselines, when the served model needs it.
    """
    root = Path(root)
    if protocol not in FILES:
        raise ReferenceError(f"protocol must be one of {', '.join(FILES)}; got {protocol!r}")
    if baseline_input_tokens is not None and (isinstance(baseline_input_tokens, bool) or not isinstance(
            baseline_input_tokens, int) or baseline_input_tokens <= 0):  # 0 once fell back to the default silently
        raise ReferenceError(f"--baseline-input-tokens must be a positive integer (the baselines' prompt limit in "
                             f"tokens), got {baseline_input_tokens!r}; leave it out for the checkout's MAX_INPUT_LEN")
    if not root.is_dir():
        raise ReferenceError(f"{root} is not a folder; pass the root of a checkout of {REPO}")
    agent_file, baseline_file = FILES[protocol]
    agent = _require(root, agent_file, AGENT_NAMES)
    base = _require(root, baseline_file, BASELINE_NAMES)
    env = _require(root, ENVS, ENV_NAMES)
    for name in ENV_NAMES:
        if not isinstance(env[name], int) or env[name] <= 0:
            raise ReferenceError(f"{root / ENVS}: {name} must default to a positive integer, got {env[name]!r}")
    fields = {"prompt": "question", "memory": "memory"}
    inputs = env["MAX_INPUT_LEN"] if baseline_input_tokens is None else baseline_input_tokens
    data = {
        "name": f"official-{protocol}",
        "prompts": {
            "memory_template": agent_template(agent["TEMPLATE"], f"{agent_file}: TEMPLATE", {**fields, "chunk": "chunk"}),
            "final_template": agent_template(agent["TEMPLATE_FINAL"], f"{agent_file}: TEMPLATE_FINAL", fields),
            "empty_memory": agent["NO_MEMORY"],
            "baseline_template": baseline_template(base["template_0shot"], f"{baseline_file}: template_0shot"),
            "answer_protocol": protocol,
            "think": "strip",
        },
        "sampling": {"temperature": 0.7, "top_p": 0.95, "seed": None, "repeats": 1},
        "budgets": {
            "chunk_tokens": env["RECURRENT_CHUNK_SIZE"], "memory_tokens": env["RECURRENT_MAX_NEW"],
            "answer_tokens": env["RECURRENT_MAX_NEW"], "query_tokens": AgentConfig.query_tokens, "document_tokens": None,
            "baseline_answer_tokens": env["MAX_OUTPUT_LEN"],
            "baseline_window": inputs + env["MAX_OUTPUT_LEN"],  # the prompt limit plus the answer
            "yarn_factor": yarn_factor,
        },
        "scoring": {"golds": "first", "empty": "zero", "failed": "skip"},
        "chat_template_kwargs": {},
    }
    try:
        return profile_from_dict(data, source=f"the profile read from {root}")
    except ReferenceError:
        raise
    except ConfigError as e:
        raise ReferenceError(f"{e}; is {root} a checkout of {REPO}?") from None
