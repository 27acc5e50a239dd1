"""Start the service: options, the backend, the state folder, then uvicorn."""
from __future__ import annotations

import ipaddress
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from memagent.backends.base import Backend
from memagent.backends.options import BackendOptions
from memagent.config import AgentConfig
from memagent.errors import InputError
from memagent.flags import MODEL_HELP, BudgetOptions, check_flags, flag, flag_values

log = logging.getLogger(__name__)


@dataclass
class ServeOptions:
    """What `memagent serve` was asked: one field per command-line option (the CLI is built from them)."""

    model: str = field(metadata=flag(MODEL_HELP))
    backend: BackendOptions = field(default_factory=BackendOptions)
    host: str = field(default="127.0.0.1", metadata=flag(
        "Address to bind; another than loopback needs --api-key-env."))
    port: int = field(default=8000, metadata=flag("TCP port."))
    state_dir: Path = field(default=Path("memagent-state"), metadata=flag(
        "Folder of the SQLite job store and the uploaded documents (a restart resumes its jobs)."))
    api_key_env: Optional[str] = field(default=None, metadata=flag(
        "Environment variable holding the key clients send as 'Authorization: Bearer KEY'."))
    profile: Optional[Path] = field(default=None, metadata=flag("Protocol profile (YAML); flags override it."))
    budgets: BudgetOptions = field(default_factory=BudgetOptions)
    max_jobs: int = field(default=4, metadata=flag("Jobs run at once."))
    max_queue: int = field(default=64, metadata=flag(
        "Jobs waiting beyond --max-jobs; more get 429 with Retry-After."))
    max_body_bytes: int = field(default=16 << 20, metadata=flag(
        "Largest JSON request (a document sent inline included)."))
    max_document_bytes: int = field(default=8 << 30, metadata=flag("Largest uploaded document."))
    max_question_chars: int = field(default=8192, metadata=flag("Longest question."))
    prompt_split: str = field(default="auto", metadata=flag(
        "Where the question is in a one-message chat (document and question together, as harnesses send it): "
        "auto | messages | paragraph | line | separator:TEXT (docs/harnesses.md); a request's prompt_split wins."))


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


def build(o: ServeOptions, backend: Backend, config: AgentConfig, key: str | None = None,
          serialize: bool = True) -> tuple[Any, Any]:
    """(app, manager) over `backend`, with state under `o.state_dir`; unfinished jobs resumed."""
    from memagent.serve.app import ServeSettings, create_app
    from memagent.serve.backend import SharedBackend
    from memagent.serve.documents import DocumentStore
    from memagent.serve.jobs import JobManager
    from memagent.serve.metrics import Metrics
    from memagent.serve.store import Store

    o.state_dir.mkdir(parents=True, exist_ok=True)
    metrics = Metrics()
    shared = SharedBackend(backend, serialize=serialize, on_call=metrics.model_call)
    manager = JobManager(Store(o.state_dir / "serve.sqlite3"), DocumentStore(o.state_dir / "documents",
                         o.max_document_bytes), shared, config, metrics, o.max_jobs, o.max_queue)
    metrics.gauges.update(memagent_queue_length=lambda: manager.count("queued"),
                          memagent_jobs_running=lambda: manager.count("running"))
    from memagent.agent.split_prompt import parse_rule

    settings = ServeSettings(model_name=o.model, api_key=key, max_body_bytes=o.max_body_bytes,
                             max_question_chars=o.max_question_chars, prompt_split=parse_rule(o.prompt_split))
    app = create_app(manager, settings)
    manager.resume_all()
    return app, manager


def run_serve(o: ServeOptions) -> None:
    """Load the model and serve until interrupted; one server per state folder."""
    from memagent.lock import run_lock
    from memagent.profile import open_backend
    from memagent.run import model_profile
    from memagent.serve import require_serve_deps

    require_serve_deps()
    check_flags(flag_values(o))
    from memagent.agent.split_prompt import parse_rule

    parse_rule(o.prompt_split)  # a bad rule is refused before the model loads
    if not 0 < o.port < 65536:
        raise InputError(f"--port must be in 1..65535, got {o.port}")
    key = api_key(o)
    profile = model_profile(o.model, o.profile, o.budgets)
    config = profile.agent_config()
    import uvicorn

    with run_lock(o.state_dir, "memagent serve"):
        backend = open_backend(o.model, o.backend, profile)
        app, manager = build(o, backend, config, key, serialize=o.backend.name != "openai")
        log.warning("memagent serve: http://%s:%d (state in %s)", o.host, o.port, o.state_dir)
        try:
            uvicorn.run(app, host=o.host, port=o.port, log_level="warning", access_log=False,
                        timeout_graceful_shutdown=5)  # open event streams must not hold a stop
        finally:
            manager.shutdown()
