"""Write the example data that configs/churn.yaml and configs/shapes.yaml train on.

Deterministic (seeded): running it again writes the same files. The repository holds
its output; run it from the repository's root to make them again:

    .venv/bin/python configs/data/make_data.py
"""

from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

HERE = Path(__file__).resolve().parent


def churn(n: int = 400, seed: int = 0) -> pd.DataFrame:
    """Customers of a subscription service: numeric and categorical columns, a string label."""
    rng = np.random.default_rng(seed)
    plan = rng.choice(["basic", "plus", "pro"], size=n, p=[0.5, 0.3, 0.2])
    region = rng.choice(["north", "south", "east", "west"], size=n)
    tenure = rng.integers(1, 72, size=n)
    monthly = np.round(
        np.select([plan == "basic", plan == "plus"], [20.0, 45.0], 80.0) + rng.normal(0, 5, n), 2
    )
    tickets = rng.poisson(np.where(plan == "basic", 2.0, 0.8))
    score = -1.5 + 0.9 * tickets - 0.05 * tenure + 1.2 * (plan == "basic") + 0.4 * (region == "south")
    churned = rng.random(n) < 1 / (1 + np.exp(-score))
    return pd.DataFrame(
        {
            "tenure_months": tenure,
            "monthly_fee": monthly,
            "support_tickets": tickets,
            "plan": plan,
            "region": region,
            "churn": np.where(churned, "left", "stayed"),
        }
    )


def shapes(root: Path, per_class: int = 24, size: int = 16, seed: int = 0) -> None:
    """An image folder: root/<class>/*.png, RGB, three patterns in random colors and noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size]
    patterns = {
        "horizontal": lambda p: (yy // p) % 2,
        "vertical": lambda p: (xx // p) % 2,
        "checker": lambda p: ((yy // p) + (xx // p)) % 2,
    }
    for name, pattern in patterns.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            mask = pattern(int(rng.integers(2, 4)))[..., None]
            fg, bg = rng.integers(0, 256, size=3), rng.integers(0, 256, size=3)
            pixels = np.where(mask, fg, bg) + rng.normal(0, 12, size=(size, size, 3))
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(root / name / f"{i:03d}.png")


if __name__ == "__main__":
    churn().to_csv(HERE / "churn.csv", index=False)
    shapes(HERE / "shapes")
