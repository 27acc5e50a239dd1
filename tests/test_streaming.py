"""Peak RSS does not grow with document length: a large file goes through in bounded memory."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CHILD = textwrap.dedent(
    """
    import json, resource, sys
    sys.path[:0] = [sys.argv[1], sys.argv[2]]
    from pathlib import Path
    from memagent.agent.workflow import AgentInput, MemoryAgent
    from memagent.backends.tiny import build_tokenizer
    from memagent.config import AgentConfig
    from fakes import ScriptedBackend

    tok = build_tokenizer()
    backend = ScriptedBackend(tok, lambda p, c: "kept fact" if "<section>" in p else "\\\\boxed{x}", record=False)
    cfg = AgentConfig(chunk_tokens=5000, memory_tokens=64)
    peaks = []
    for path in sys.argv[3:]:
        [res] = MemoryAgent(backend, cfg).run([AgentInput("what is kept?", Path(path))])
        peaks.append((res.num_chunks, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
    print(json.dumps(peaks))
    """
)


@pytest.mark.slow
def test_peak_rss_is_bounded_on_a_large_file(tmp_path):
    line = "the city of memory keeps the value of the key near the river and the film\n"
    small, big = tmp_path / "small.txt", tmp_path / "big.txt"
    small.write_text(line * 4_000)  # ~0.3 MB
    with open(big, "w") as f:
        for _ in range(100):
            f.write(line * 1_000)  # ~7.5 MB, about 1.6M tokens
    src = str(Path(__file__).parents[1] / "src")
    out = subprocess.run([sys.executable, "-c", CHILD, src, str(Path(__file__).parent), str(small), str(big)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    (n_small, rss_small), (n_big, rss_big) = json.loads(out.stdout)
    assert n_big > 250 and n_small < 20
    growth_mb = (rss_big - rss_small) / 1024  # ru_maxrss is in KiB on Linux
    # holding the text (7.5 MB) or its ids (~1.6M Python ints, ~60 MB) would blow this bound
    assert growth_mb < 10, f"peak RSS grew by {growth_mb:.1f} MB on a 25x longer document"
