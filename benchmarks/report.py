"""Assemble benchmarks/results.md and benchmarks/results.json from each section's files
in benchmarks/results/ (written by benchmarks/<section>.py), in a fixed order.

    python benchmarks/report.py

A section that has not been run is left out; results.md says which are missing. Where
benchmarks/analysis/<section>.md exists (written by hand: where the time goes, what was
changed), it follows its section, so re-measuring never erases it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import HERE, RESULTS, _write_atomic, machine, now, versions

SECTIONS = ("overhead", "ingest", "training", "scaling", "gpu", "sweep")
TITLES = {
    "overhead": "python benchmarks/overhead.py",
    "ingest": "python benchmarks/ingest.py",
    "training": "python benchmarks/training.py",
    "scaling": "python benchmarks/scaling.py",
    "gpu": "python benchmarks/gpu.py",
    "sweep": "python benchmarks/sweep.py",
}


ANALYSIS = HERE / "analysis"


def _load(section: dict) -> str:
    load = section["machine"].get("load_average_1_5_15min")
    return f"load {load['at_start'][0]:g} to {load['at_end'][0]:g}, " if load else ""


def assemble(results: Path = RESULTS, out: Path = HERE, analysis: Path = ANALYSIS) -> tuple[Path, Path]:
    present = [s for s in SECTIONS if (results / f"{s}.md").is_file() and (results / f"{s}.json").is_file()]
    missing = [s for s in SECTIONS if s not in present]
    sections = {s: json.loads((results / f"{s}.json").read_text()) for s in present}
    m, v = machine(), versions()
    header = [
        "# Benchmarks",
        "",
        f"Assembled {now()} on {m['cpus']} CPUs, {m['memory_gb']} GB "
        f"({m['platform']}, Python {m['python']}); "
        + ", ".join(f"{k} {v[k]}" for k in ("torch", "ray", "prefect", "pyarrow")),
        "",
        'Re-run everything with `make bench` (a subset: `make bench SECTIONS="ingest training"`); '
        "each section's figures, machine and versions are in `results.json`. When and how each "
        "section below was measured (the load average over the first minute, at its start and end: "
        "other work on the machine moves wall times):",
        "",
        *[f"- {s}: {sections[s]['date']}, {_load(sections[s])}`{TITLES[s]}`" for s in present],
        *(["", f"Not measured yet: {', '.join(missing)}."] if missing else []),
    ]
    body = []
    for s in present:
        body.append((results / f"{s}.md").read_text().rstrip())
        if (analysis / f"{s}.md").is_file():
            body.append((analysis / f"{s}.md").read_text().rstrip())
    md = "\n".join(header) + "\n\n" + "\n\n".join(body) + "\n"
    doc = {"assembled": now(), "machine": m, "versions": v, "sections": sections}
    _write_atomic(out / "results.md", md)
    _write_atomic(out / "results.json", json.dumps(doc, indent=2) + "\n")
    return out / "results.md", out / "results.json"


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    md, js = assemble()
    print(f"wrote {md} and {js}")


if __name__ == "__main__":
    main()
