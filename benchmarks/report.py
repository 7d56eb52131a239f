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

SECTIONS = (
    "overhead",
    "overhead_phases",
    "warm_start",
    "load",
    "cold_under_load",
    "ingest",
    "training",
    "epoch_save",
    "resnet",
    "scaling",
    "scaling_streamed",
    "large_prepare",
    "engine",
    "image_memory",
    "batch_predict",
    "serve",
    "gpu",
    "sweep",
    "hf_models",
    "hf_finetune",
    "suite",
)
# The script of each section, for results written before each JSON recorded its command.
SCRIPTS = {s: f"benchmarks/{s}.py" for s in SECTIONS} | {
    "overhead_phases": "benchmarks/overhead.py --phases",
    "scaling_streamed": "benchmarks/scaling.py --stream",
}


ANALYSIS = HERE / "analysis"


def _load(section: dict) -> str:
    load = section["machine"].get("load_average_1_5_15min")
    return f"load {load['at_start'][0]:g} to {load['at_end'][0]:g}, " if load else "load not recorded, "


def _measured(name: str, section: dict) -> str:
    """When, on what machine, under what load and by what command a section was measured."""
    m = section["machine"]
    command = (
        f"`{section['command']}`"
        if section.get("command")
        else f"`python {SCRIPTS[name]}` (its arguments not recorded)"
    )
    return f"- {name}: {section['date']}, {m['cpus']} CPUs, {m['memory_gb']} GB, {_load(section)}{command}"


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
        "section below was measured, on what machine, under what load (the load average over the "
        "first minute, at its start and end: other work on the machine moves wall times) and by "
        "what command:",
        "",
        *[_measured(s, sections[s]) for s in present],
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
