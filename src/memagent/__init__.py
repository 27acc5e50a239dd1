"""MemAgent: long documents read chunk by chunk with an overwritten, fixed-size text memory.

The package, lowest layer first (pyproject.toml's import-linter contracts keep the order: a module imports only from its own
layer and the layers before it).

Base helpers, flat at the top (each imports at most other base modules):

    errors.py     MemAgentError and InputError: what the CLI prints as one `error: ...` line
    config.py     AgentConfig, the read-write loop's settings (the paper's defaults), and ConfigError
    flags.py      the options ask, eval and serve share (budgets, sampling) and their checks
    io.py         outputs checked before any work, the atomic writer, clear OS errors
    jsonl.py      JSONL read line by line (`iter_jsonl`), a torn last line trimmed
    bounded.py    the bounded JSON and YAML reader for everything users hand us
    text.py       the one decoding rule for text (valid UTF-8, no surrogates)
    lock.py       one run per output (file locks)
    progress.py   progress on stderr: a bar on a terminal, plain lines in a log
    model_shapes.py  shapes and parameter counts of known models (FLOPs, the training memory estimate)
    prompts.py    the paper's prompt templates and their placeholders (AgentConfig's defaults)
    timeline/     the memory timeline of a trace: its rows, evidence steps and the `memagent report` HTML file

The layers above:

    backends/     the model Protocol and its implementations (transformers, vLLM, OpenAI-compatible HTTP, tiny)
    agent/        chunking, the read-write loop (a workflow: a generator of model calls), the scheduler
    tasks/        samples, data synthesis, released formats, metrics
    rl/           training (SFT, Multi-Conv DAPO)
    eval/         the evaluation sweep, baselines, scoring, Table 1
    protocol/     protocol profiles: every setting that changes a score, in one YAML file (`protocol.profile`),
                  where a command's settings come from (`protocol.resolve`) and the official profile
                  (`protocol.reference`)
    scale/        Ray actors for ask and eval
    demo/         the toy experiment on 2 CPU cores
    streams/      event streams that grow, standing questions kept current as text arrives (`memagent.Stream`)
    ask/          `memagent ask`: its options, its run and its files
    cli/, serve/, harness/
                  the commands, the HTTP service and the lm-eval / Inspect AI integrations
"""

__version__ = "0.1.0"


from memagent.streams import Stream  # noqa: E402  (memagent.Stream: a stream file in Python)

__all__ = ["Stream", "__version__"]
