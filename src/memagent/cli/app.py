"""The `memagent` typer application the command modules register on, and a parser they share."""
from __future__ import annotations

from typing import Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="MemAgent: read documents of any length with a fixed-size, RL-trained memory.")


def int_list(text: Optional[str], option: str, minimum: int = 1) -> list[int]:
    """Parse "50,100,200" (underscores allowed: 1_000); every value at least `minimum`."""
    if not text:
        return []
    try:
        values = [int(part.strip().replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}", param_hint=option) from None
    if not values or any(v < minimum for v in values):
        kind = "positive integers" if minimum == 1 else f"integers >= {minimum}"
        raise typer.BadParameter(f"expected {kind}, got {text!r}", param_hint=option)
    return values
