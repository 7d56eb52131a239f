"""The digits data the baselines train on: scikit-learn's 8x8 digits, a stratified
70/10/20 split (trainflow's default shares) and the train split's mean and std."""

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split


def standardized_splits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_val, y_val), features standardized with train statistics."""
    digits = load_digits()
    x = digits.data.astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_rest, y_train, y_rest = train_test_split(x, y, test_size=0.3, stratify=y, random_state=0)
    x_val, _, y_val, _ = train_test_split(x_rest, y_rest, test_size=2 / 3, stratify=y_rest, random_state=0)
    mean, std = x_train.mean(0), x_train.std(0) + 1e-6
    return (x_train - mean) / std, y_train, (x_val - mean) / std, y_val
