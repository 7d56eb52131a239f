import numpy as np
import pytest

from trainflow.pipelines.evaluation import reports

HISTORY = [
    {"epoch": e, "train_loss": 2.0 / e, "val_loss": 2.2 / e, "val_accuracy": 1 - 0.5 / e} for e in range(1, 6)
]


def pixels(path) -> np.ndarray:
    import matplotlib.image

    return matplotlib.image.imread(str(path))


def test_the_learning_curve_is_a_real_non_blank_png(tmp_path):
    path = reports.learning_curve_png(HISTORY, tmp_path / "out" / "curve.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = pixels(path)
    assert img.shape[:2] == (400, 640)
    # Lines, axes and text: many distinct colours and real variance, not a blank canvas.
    assert img[..., :3].std() > 0.05
    assert len(np.unique(img[..., :3].reshape(-1, 3), axis=0)) > 50
    assert [p.name for p in path.parent.iterdir()] == ["curve.png"]  # no temp file left


def test_the_confusion_matrix_png_shows_the_counts(tmp_path):
    path = reports.confusion_matrix_png([[5, 1], [0, 7]], ["cat", "dog"], tmp_path / "cm.png")
    img = pixels(path)
    assert img[..., :3].std() > 0.05
    assert reports.data_uri(path).startswith("data:image/png;base64,iVBORw0KGgo")


def test_an_empty_history_is_refused(tmp_path):
    with pytest.raises(ValueError, match="history is empty"):
        reports.learning_curve_png([], tmp_path / "c.png")
