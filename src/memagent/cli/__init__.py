"""The `memagent` command line: each command parses, builds an options object and calls one library function.

Commands live in one module per group (`ask`: ask, serve, report; `evaluate`: eval, flops, profile; `data`;
`train`: train, demo, tiny-model; `stream`: stream create|append|ask|watch|show); this module runs the application and turns errors into one line.
"""
from __future__ import annotations

import errno
import logging
import os
import sys
import traceback
import warnings
from typing import Optional

import typer

try:  # typer's own parser (older typer versions run on click)
    import click
except ImportError:  # pragma: no cover - newer typer carries its own copy
    click = None
try:  # the click copy newer typer versions carry (typer >= 0.2x)
    from typer._click import exceptions as vendored_click
except ImportError:
    vendored_click = None

from memagent.cli import ask, data, evaluate, model, stream, train  # noqa: F401  (each registers its commands on `app`)
from memagent.cli.app import app
from memagent.backends.redact import redact
from memagent.config import ConfigDeprecation
from memagent.errors import MemAgentError
from memagent.io import os_error_message
from memagent.progress import quiet_libraries
from memagent.scale.options import bare_ray_flag
from memagent.text import check_argv

__all__ = ["app", "fail", "main", "run", "user_error"]


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


def _fail(message: str) -> int:
    if os.environ.get("OPENAI_API_KEY"):  # the openai backend's key: redacted where made; again here, to be sure
        message = redact(str(message), os.environ["OPENAI_API_KEY"])
    typer.echo(f"error: {_one_line(message)}", err=True)
    return 2


def run(args: Optional[list[str]] = None) -> int:
    """Run the CLI on `args` (default sys.argv[1:]); returns the exit code (see `_run`). An old spelling in a
    config file, a profile or an override (memagent.config.ConfigDeprecation) is one `warning: ...` line on
    stderr, once per spelling."""
    with warnings.catch_warnings():
        warnings.simplefilter("default", ConfigDeprecation)
        shown = warnings.showwarning

        def show(message, category, *rest, **kw):  # type: ignore[no-untyped-def]
            if issubclass(category, ConfigDeprecation):
                typer.echo(f"warning: {_one_line(str(message))}", err=True)
            else:
                shown(message, category, *rest, **kw)

        warnings.showwarning = show
        return _run(args)


def _run(args: Optional[list[str]] = None) -> int:
    """Run the CLI on `args` (default sys.argv[1:]); returns the exit code.

    Every user-caused failure is one `error: ...` line and code 2: a `MemAgentError`, a bad flag
    (click's usage errors), an OS error the user can fix (permission, missing folder, disk full, a
    path under a file, ...) and text that is not UTF-8. Anything else is a bug: its traceback, then a
    line asking to report it, and code 1.
    """
    usage_errors, aborts = _click_exceptions()
    args = sys.argv[1:] if args is None else args
    bad_arg = check_argv(args)  # one rule for text: arguments must be valid UTF-8 (memagent.text)
    if bad_arg is not None:
        return _fail(bad_arg)
    try:
        args = bare_ray_flag(args)  # `--ray` alone: a local Ray instance
        code = app(args=args, prog_name="memagent", standalone_mode=False)
    except usage_errors as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # `memagent` alone: the help text
            typer.echo(e.format_message(), err=True)
            return 2
        ctx = getattr(e, "ctx", None)
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        return _fail(e.format_message() + hint)
    except aborts:
        typer.echo("aborted", err=True)
        return 1
    except OSError as e:
        if e.errno == errno.EPIPE:  # the reader of stdout went away (e.g. `| head`)
            return 1
        message = user_error(e)
        return _bug() if message is None else _fail(message)
    except (MemAgentError, UnicodeDecodeError) as e:
        return _fail(user_error(e) or str(e))
    except KeyboardInterrupt:
        code = 130
    except Exception:  # noqa: BLE001  (the last resort: a bug)
        return _bug()
    if code == 130:
        typer.echo("interrupted", err=True)
    return code if isinstance(code, int) else 0


def user_error(e: BaseException) -> Optional[str]:
    """The one-line message of a failure the user can fix (what `run` turns into exit code 2): a
    `MemAgentError`, text that is not UTF-8, an OS error the user can fix; None for anything else (a bug)."""
    if isinstance(e, MemAgentError):
        return str(e)
    if isinstance(e, UnicodeDecodeError):
        return f"an input is not valid UTF-8 text (byte {e.start}: {e.reason}); save it as UTF-8"
    if isinstance(e, OSError):
        return os_error_message(e)
    return None


def fail(e: BaseException) -> None:
    """For entry points memagent does not own (the harnesses' CLIs): a user error `e` becomes one `error:` line
    on stderr (the API key redacted) and SystemExit(2); anything else is raised again, unchanged."""
    message = user_error(e)
    if message is None:
        raise e
    raise SystemExit(_fail(message)) from None


def _click_exceptions() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """(usage errors, aborts) of click and of the click copy newer typer versions carry (typer._click)."""
    usage: list[type[BaseException]] = []
    aborts: list[type[BaseException]] = [typer.Abort]
    if click is not None:
        usage.append(click.exceptions.ClickException)
        aborts.append(click.exceptions.Abort)
    if vendored_click is not None:
        usage.append(vendored_click.ClickException)
        aborts.append(getattr(vendored_click, "Abort", typer.Abort))
    return tuple(usage), tuple(aborts)


def _bug() -> int:
    traceback.print_exc()
    typer.echo("memagent hit an internal error (a bug, not a problem with your input); please report it "
               "(open an issue on the project) with the command you ran and the traceback above", err=True)
    return 1


def main() -> None:
    """Entry point: known errors become one clear line on stderr and exit code 2."""
    quiet_libraries()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    sys.exit(run())


