"""lm-eval's own CLI with the `memagent` model registered (lm-eval has no entry point for external models):
`python -m memagent.harness.lm_eval_cli --model memagent --model_args model=DIR --tasks T --include_path D`,
or the `memagent-lm-eval` script. Every argument is lm-eval's, with two differences for `--model memagent`:

- a failure the user can fix (a bad `--model_args` key or value, a missing model, an unknown workflow or prompt
  rule) is one `error: ...` line and exit code 2, as in `memagent` itself (`memagent.cli.fail`);
- without `--device`, the model runs on `device=auto`: lm-eval's own default is `cuda:0`, which a machine
  without a GPU does not have (`--device` given, or `device=` in `--model_args`, is taken as it is).
"""
from __future__ import annotations

import sys

from memagent.cli import fail


def default_device(argv: list[str]) -> list[str]:
    """`argv` with `--device auto` added for `--model memagent` when neither `--device` nor a `--config` file
    (which may set one) is given; otherwise `argv` as it is."""
    def given(name: str) -> bool:
        return any(a == name or a.startswith(name + "=") for a in argv)

    models = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--model"]
    models += [a.split("=", 1)[1] for a in argv if a.startswith("--model=")]
    if "memagent" not in models or given("--device") or given("--config"):
        return argv
    return [*argv, "--device", "auto"]


def main() -> None:
    try:
        # importing it registers the model with lm-eval
        import memagent.harness.lm_eval  # noqa: F401  # lazy: lm_eval
        from lm_eval.__main__ import cli_evaluate  # lazy: lm_eval

        sys.argv[1:] = default_device(sys.argv[1:])
        cli_evaluate()
    except Exception as e:  # noqa: BLE001  (a user error: one line, exit 2; anything else raised again)
        fail(e)


if __name__ == "__main__":
    main()
