"""lm-eval's own CLI with the `memagent` model registered (lm-eval has no entry point for external models):
`python -m memagent.harness.lm_eval_cli --model memagent --model_args model=DIR --tasks T --include_path D`,
or the `memagent-lm-eval` script. Every argument is lm-eval's."""
from __future__ import annotations

import sys

from memagent.errors import MemAgentError


def main() -> None:
    try:
        # importing it registers the model with lm-eval
        import memagent.harness.lm_eval  # noqa: F401  # lazy: lm_eval
    except MemAgentError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    from lm_eval.__main__ import cli_evaluate  # lazy: lm_eval

    cli_evaluate()


if __name__ == "__main__":
    main()
