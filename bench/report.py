"""The figures table of bench/README.md, from the JSON results: each headline against its target,
with the date, load average and command of the run that produced it.
Run: .venv/bin/python bench/report.py   (prints Markdown)
"""
from __future__ import annotations

import json
import operator

from common import RESULTS

ORDER = ["scaling", "overhead", "batching", "chunker", "trainer_vs_trl"]
OPS = {">=": operator.ge, "<=": operator.le}


def meets(value: float, target: str) -> bool:
    op, bound = target.split()
    return OPS[op](value, float(bound))


def main() -> None:
    lines = ["| figure | measured | target | met | run (UTC) | load avg (1/5/15 min) | command |",
             "|---|---|---|---|---|---|---|"]
    for name in ORDER:
        path = RESULTS / f"{name}.json"
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        m = data["machine"]
        load = "/".join(f"{x:.1f}" for x in m["load_avg"])
        for key, value in data["headline"].items():
            target = data["targets"][key]
            lines.append(f"| `{key}` | {value:.3f} | {target} | {'yes' if meets(value, target) else '**no**'} | "
                         f"{m['date']} | {load} | `python bench/{name}.py` |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
