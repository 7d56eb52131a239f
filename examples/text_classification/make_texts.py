"""Write texts.csv: short English sentences labelled by the library they document.

Each row is the first line of a docstring of a public function or class of numpy,
pandas or torch, as installed here, with the library's own name taken out (the model
learns from the rest of the words: "tensor" and "gradient" from torch, "DataFrame" and
"index" from pandas, "array" and "axis" from numpy). Nothing is downloaded. The rows
differ a little between versions of those libraries; the committed texts.csv is what
the example trains on.

    ../../.venv/bin/python make_texts.py
"""

import csv
import importlib
import inspect
import random
import re
from pathlib import Path

LIBRARIES = {
    "numpy": ["numpy", "numpy.linalg", "numpy.random"],
    "pandas": ["pandas"],
    "torch": ["torch", "torch.nn"],
}
PER_LIBRARY = 120
OUT = Path(__file__).with_name("texts.csv")


def first_lines(module_names: list[str]) -> set[str]:
    """The first line of the docstring of each public callable of these modules."""
    lines = set()
    for name in module_names:
        module = importlib.import_module(name)
        for attr in dir(module):
            if attr.startswith("_"):
                continue
            doc = inspect.getdoc(getattr(module, attr, None)) or ""
            line = doc.strip().split("\n")[0].strip()
            if 20 <= len(line) <= 120 and re.fullmatch(r"[A-Za-z][\w ,.'()\-`/]*", line):
                lines.add(line)
    return lines


def main() -> None:
    rng = random.Random(0)
    rows = []
    for library, modules in LIBRARIES.items():
        own = re.compile(rf"\b{library}\b", re.IGNORECASE)
        lines = sorted(own.sub("", line).strip() for line in first_lines(modules))
        rows += [(text, library) for text in rng.sample(lines, min(PER_LIBRARY, len(lines)))]
    rng.shuffle(rows)
    with OUT.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "library"])
        writer.writerows(rows)
    print(f"wrote {len(rows)} rows to {OUT}")


if __name__ == "__main__":
    main()
