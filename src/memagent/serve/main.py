"""Start the service: options, the state folder, the backend, then uvicorn.

Everything that would make every request fail is refused before the port is bound, with one `error:` line:
an option out of its range (each rule sits beside its option, in `ServeOptions`), a state folder whose
database is not ours, a tokenizer that encodes text to nothing, prompts the model's chat template cannot
render, budgets over the model's window.
"""
from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Optional

from memagent.prompts import render
from memagent.agent.registry import DEFAULT_WORKFLOW, BoundWorkflow, Runner, build_workflow
from memagent.split_prompt import parse_rule
from memagent.backends.base import Backend
from memagent.backends.options import BackendOptions
from memagent.config import AgentConfig, rule
from memagent.errors import InputError, MemAgentError
from memagent.flags import (MODEL_HELP, WORKFLOW_OPTION_HELP, BudgetOptions, SamplingOptions, check_options, flag,
                            parse_workflow_options)
from memagent.lock import run_lock
from memagent.protocol.profile import open_backend
from memagent.protocol.resolve import workflow_profile
from memagent.serve import require_serve_deps
from memagent.serve.backend import SharedBackend
from memagent.serve.documents import DocumentStore
from memagent.serve.jobs import JobManager
from memagent.serve.metrics import Metrics
from memagent.serve.requests import ServeSettings
from memagent.serve.store import Store

log = logging.getLogger(__name__)


def bounds(low: int, high: int | None, why: str) -> dict[str, Any]:
    """Field metadata: the option's rule, its value in [low, high] (high None: no upper bound), and `why`, what
    the bound is for (the message's second half). Checked by `memagent.flags.check_options`, as the options
    are built (`ServeOptions.__post_init__`)."""
    return {**rule(min=low, max=high), "why": why}


@dataclass
class ServeOptions:
    """What `memagent serve` was asked: one field per command-line option (the CLI is built from them).
    A count or size out of its `bounds` is refused as the options are built, before anything starts."""

    model: str = field(metadata=flag(MODEL_HELP))
    backend: BackendOptions = field(default_factory=BackendOptions)
    host: str = field(default="127.0.0.1", metadata=flag(
        "Address to bind; another than loopback needs --api-key-env."))
    port: int = field(default=8000, metadata={**flag("TCP port."), **bounds(1, 65535, "a TCP port")})
    state_dir: Path = field(default=Path("memagent-state"), metadata=flag(
        "Folder of the SQLite job store and the uploaded documents (a restart resumes its jobs)."))
    api_key_env: Optional[str] = field(default=None, metadata=flag(
        "Environment variable holding the key clients send as 'Authorization: Bearer KEY'."))
    profile: Optional[Path] = field(default=None, metadata=flag("Protocol profile (YAML); flags override it."))
    budgets: BudgetOptions = field(default_factory=BudgetOptions)
    max_jobs: int = field(default=4, metadata={**flag("Jobs run at once."), **bounds(
        1, 1024, "one thread per job: with 0 no job would ever run")})
    max_queue: int = field(default=64, metadata={**flag(
        "Jobs waiting beyond --max-jobs; more get 429 with Retry-After."), **bounds(
        0, 1_000_000, "0: no job waits beyond --max-jobs")})
    max_body_bytes: int = field(default=16 << 20, metadata={**flag(
        "Largest JSON request (a document sent inline included)."), **bounds(
        1024, 1 << 30, "a JSON request is held in memory whole; the smallest chat request is about 100 bytes")})
    max_document_bytes: int = field(default=8 << 30, metadata={**flag("Largest uploaded document."), **bounds(
        1, None, "uploads are streamed to disk; 0 would refuse every document")})
    max_question_chars: int = field(default=8192, metadata={**flag("Longest question."), **bounds(
        1, 1 << 20, "0 would refuse every question")})

    workflow: str = field(default="memagent", metadata=flag(
        "Reading workflow of the jobs (memagent, lookup, skim, or one a package registers); a job may name its own "
        "(\"workflow\" in POST /v1/jobs)."))
    workflow_option: list[str] = field(default_factory=list, metadata=flag(
        WORKFLOW_OPTION_HELP + " For the server's workflow (a job naming another runs it with its defaults).",
        "--workflow-option"))
    prompt_split: str = field(default="auto", metadata=flag(
        "Where the question is in a one-message chat (document and question together, as harnesses send it): "
        "auto | messages | paragraph | line | separator:TEXT (docs/harnesses.md); a request's prompt_split wins."))

    checks_itself: ClassVar[bool] = True  # checked as built: the CLI does not check them again

    def __post_init__(self) -> None:
        check_options(self)  # each option's rule, beside its field


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def api_key(o: ServeOptions) -> str | None:
    """The key from `--api-key-env`; refuses a non-loopback host without one."""
    key = None
    if o.api_key_env is not None:
        key = os.environ.get(o.api_key_env)
        if not key:
            raise InputError(f"--api-key-env {o.api_key_env}: the environment variable is not set or empty; "
                             "export it with the key clients must send")
    if key is None and not is_loopback(o.host):
        raise InputError(f"--host {o.host} is not a loopback address: anyone who reaches it could use the model; "
                         "give an API key with --api-key-env NAME (or bind 127.0.0.1)")
    return key


def open_state(o: ServeOptions) -> tuple[Any, Any]:
    """(the job store, the document store) of `o.state_dir`: a database that is not ours is refused, and the
    pieces of uploads a killed server left (documents/.doc_*.part) are removed."""
    o.state_dir.mkdir(parents=True, exist_ok=True)
    store = Store(o.state_dir / "serve.sqlite3")
    return store, DocumentStore(o.state_dir / "documents", o.max_document_bytes)


def check_ready(backend: Backend, config: AgentConfig, workflow: str | BoundWorkflow = DEFAULT_WORKFLOW,
                workflow_options: dict[str, Any] | None = None) -> Runner:
    """Refuse a model every request would fail on: a tokenizer that encodes text to no tokens (its files are
    missing), prompts its chat template cannot render (e.g. a profile's chat_template_kwargs), budgets over
    its window. Nothing is generated. Returns the server's workflow built (each job binds it to its own run)."""
    if not backend.tokenizer("Which river runs through the city?", add_special_tokens=False)["input_ids"]:
        raise InputError("the model's tokenizer encodes text to no tokens: its tokenizer files (tokenizer.json, "
                         "tokenizer_config.json) are missing or not its own; give a model folder with them")
    try:
        backend.prompt_length(render(config.memory_template, question="q", memory="m", chunk="c"))
        backend.prompt_length(render(config.final_template, question="q", memory="m"))
    except MemAgentError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever breaks here breaks every request: refuse to start
        raise InputError(f"the model cannot render a prompt ({type(e).__name__}: {str(e)[:200]}); check the "
                         "profile's chat_template_kwargs and the model's chat template") from None
    if config.seed is not None and not 0 <= config.seed < 2**32:  # every seeded call would fail
        raise InputError(f"the profile's sampling seed {config.seed} is out of range; give one in 0..2**32-1")
    runner = build_workflow(workflow, backend, config, **(workflow_options or {}))
    runner.check_budget([])  # its largest prompts
    return runner



def build(o: ServeOptions, backend: Backend, config: AgentConfig, key: str | None = None,
          serialize: bool = True, state: tuple[Any, Any] | None = None,
          workflow_options: dict[str, Any] | None = None, runner: Runner | None = None) -> tuple[Any, Any]:
    """(app, manager) over `backend`, with state under `o.state_dir` (`state`: the stores `open_state` gave);
    unfinished jobs resumed. `workflow_options`: the server's workflow's (default: --workflow-option's);
    `runner`: the server's workflow built already (`check_ready`; None: built on the first job)."""
    from memagent.serve.app import create_app  # lazy: fastapi

    store, docs = state if state is not None else open_state(o)
    metrics = Metrics()
    shared = SharedBackend(backend, serialize=serialize, on_call=metrics.model_call)
    options = parse_workflow_options(o.workflow_option) if workflow_options is None else workflow_options
    manager = JobManager(store, docs, shared, config, metrics, o.max_jobs, o.max_queue, o.workflow, options, runner)
    metrics.gauges.update(memagent_queue_length=lambda: manager.count("queued"),
                          memagent_jobs_running=lambda: manager.count("running"))
    settings = ServeSettings(model_name=o.model, api_key=key, max_body_bytes=o.max_body_bytes,
                             max_question_chars=o.max_question_chars, prompt_split=parse_rule(o.prompt_split))
    app = create_app(manager, settings)
    manager.resume_all()
    return app, manager


def run_serve(o: ServeOptions) -> None:
    """Load the model and serve until interrupted; one server per state folder."""
    require_serve_deps()
    parse_rule(o.prompt_split)  # a bad rule is refused before the model loads
    key = api_key(o)
    # the profile and the workflow bound to its options (the profile's, then the flags'), once, before the model loads
    profile, workflow = workflow_profile(o.model, o.profile, o.budgets, SamplingOptions(), o.workflow,
                                         o.workflow_option)
    config = profile.agent_config()
    import uvicorn  # lazy: uvicorn

    sockets = bind_sockets(o.host, o.port)  # a host that does not resolve, a port in use: refused before the model
    try:
        _serve_on(o, sockets, key, profile, config, workflow, uvicorn)
    finally:
        for sock in sockets:
            sock.close()


def bind_sockets(host: str, port: int) -> list[socket.socket]:
    """Sockets bound to every address `host` resolves to, on `port` (not yet listening: uvicorn listens once the
    model is loaded). A name that does not resolve, a port in use or one this user may not bind is one
    InputError (it was the server library's own log line and exit code 3, after the model had loaded)."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise InputError(f"--host {host!r} does not resolve to an address ({e.strerror}); give an IP address "
                         "(127.0.0.1, 0.0.0.0, ::1) or a name this machine can look up") from None
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys((i[0], i[1], i[2], i[3], i[4]) for i in infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart reuses the port
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError as e:
        for sock in sockets:
            sock.close()
        where = f"{host}:{port}"
        if e.errno == errno.EADDRINUSE:
            raise InputError(f"--port {port}: the address {where} is already in use (another server?); choose "
                             "another --port, or stop the program that holds it") from None
        if e.errno in (errno.EACCES, errno.EPERM):
            raise InputError(f"--port {port}: this user may not bind {where} (ports below 1024 need privileges); "
                             "choose a port of 1024 or more") from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise InputError(f"--host {host}: no network interface of this machine has that address; give one "
                             "of its addresses (127.0.0.1, 0.0.0.0 for all)") from None
        raise InputError(f"cannot bind {where} ({e.strerror or e}); choose another --host or --port") from None
    return sockets


def _serve_on(o: ServeOptions, sockets: list[socket.socket], key: str | None, profile: Any, config: AgentConfig,
              workflow: BoundWorkflow, uvicorn: Any) -> None:
    """Load the model and serve on the bound `sockets` until interrupted (run_serve's second half)."""
    with run_lock(o.state_dir, "memagent serve"):
        state = open_state(o)  # before the model loads: a bad database is refused at once
        try:
            backend = open_backend(o.model, o.backend, profile)
            try:
                runner = check_ready(backend, config, workflow)
            except BaseException:
                getattr(backend, "close", lambda: None)()
                raise
        except BaseException:
            state[0].close()
            raise
        app, manager = build(o, backend, config, key, serialize=o.backend.name != "openai", state=state,
                             workflow_options=workflow.options, runner=runner)
        log.warning("memagent serve: http://%s:%d (state in %s)", o.host, o.port, o.state_dir)
        try:
            server = uvicorn.Server(uvicorn.Config(  # a grace of 5 s: open event streams must not hold a stop
                app, host=o.host, port=o.port, log_level="warning", access_log=False, timeout_graceful_shutdown=5))
            server.run(sockets=sockets)
        finally:
            manager.shutdown()
