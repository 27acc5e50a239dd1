"""lm-eval's own CLI with the `memagent` model registered (lm-eval has no entry point for external models):
`python -m memagent.harness.lm_eval_cli --model memagent --model_args model=DIR --tasks T --include_path D`,
or the `memagent-lm-eval` script. Every argument is lm-eval's."""
from __future__ import annotations

import sys


def main() -> None:
    from memagent.errors import MemAgentError

    try:
        import memagent.harness.lm_eval  # noqa: F401  (registers the model)
    except MemAgentError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
