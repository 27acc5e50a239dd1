"""Start the service: options, the backend, the state folder, then uvicorn."""
from __future__ import annotations

import ipaddress
import logging
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from memagent.backends.base import Backend
from memagent.backends.options import BackendOptions
from memagent.config import AgentConfig
from memagent.errors import InputError

log = logging.getLogger(__name__)


@dataclass
class ServeOptions:
    model: str
    backend: BackendOptions = field(default_factory=BackendOptions)
    host: str = "127.0.0.1"
    port: int = 8000
    state_dir: Path = Path("memagent-state")
    api_key_env: Optional[str] = None
    profile: Optional[Path] = None
    chunk_tokens: Optional[int] = None
    memory_tokens: Optional[int] = None
    answer_tokens: Optional[int] = None
    query_tokens: Optional[int] = None
    max_jobs: int = 4
    max_queue: int = 64
    max_body_bytes: int = 16 << 20
    max_document_bytes: int = 8 << 30
    max_question_chars: int = 8192


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
    settings = ServeSettings(model_name=o.model, api_key=key, max_body_bytes=o.max_body_bytes,
                             max_question_chars=o.max_question_chars)
    app = create_app(manager, settings)
    manager.resume_all()
    return app, manager


def run_serve(o: ServeOptions) -> None:
    """Load the model and serve until interrupted; one server per state folder."""
    from memagent.flags import check_flags
    from memagent.lock import run_lock
    from memagent.run import AskOptions, ask_profile
    from memagent.serve import require_serve_deps

    require_serve_deps()
    check_flags(dict(port=o.port, max_jobs=o.max_jobs, max_queue=o.max_queue, max_body_bytes=o.max_body_bytes,
                     max_document_bytes=o.max_document_bytes, max_question_chars=o.max_question_chars,
                     **o.backend.flags()))
    if not 0 < o.port < 65536:
        raise InputError(f"--port must be in 1..65535, got {o.port}")
    key = api_key(o)
    profile = ask_profile(AskOptions(model=o.model, profile=o.profile, chunk_tokens=o.chunk_tokens,
                                     memory_tokens=o.memory_tokens, answer_tokens=o.answer_tokens,
                                     query_tokens=o.query_tokens))
    config = profile.agent_config()
    import uvicorn

    with run_lock(o.state_dir, "memagent serve"):
        backend = replace(o.backend, chat_template_kwargs=profile.chat_template_kwargs,
                          yarn_factor=profile.budgets.yarn_factor).load(o.model)
        app, manager = build(o, backend, config, key, serialize=o.backend.name != "openai")
        log.warning("memagent serve: http://%s:%d (state in %s)", o.host, o.port, o.state_dir)
        try:
            uvicorn.run(app, host=o.host, port=o.port, log_level="warning", access_log=False,
                        timeout_graceful_shutdown=5)  # open event streams must not hold a stop
        finally:
            manager.shutdown()
