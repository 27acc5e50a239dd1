"""`memagent serve`: long-document question answering as an HTTP service (FastAPI + uvicorn).

Needs the `serve` extra: `pip install 'memagent[serve]'`.
"""
from __future__ import annotations

from memagent.errors import InputError


def require_serve_deps() -> None:
    """Raise InputError naming the extra when FastAPI or uvicorn is missing."""
    missing = []
    for name in ("fastapi", "uvicorn", "python_multipart"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name.replace("_", "-"))
    if missing:
        raise InputError(f"memagent serve needs {', '.join(missing)}: pip install 'memagent[serve]'")
