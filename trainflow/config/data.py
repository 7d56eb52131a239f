"""The data sections: where the rows come from, how they split, and how they are prepared."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from trainflow.config.sections import Section, hook_path


class SplitConfig(Section):
    """How the rows divide into train, val and test: by a seeded hash of each row's content,
    the same however and wherever the rows are read."""

    val: float = Field(
        0.1,
        ge=0.0,
        lt=1.0,
        description="The share of rows held out for validation, scored every epoch (val_loss, "
        "val_accuracy): it ranks checkpoints and drives early stopping.",
    )
    test: float = Field(
        0.2,
        gt=0.0,
        lt=1.0,
        description="The share of rows held out for the test split, scored once on the best "
        "checkpoint: the metrics the registry's gate compares.",
    )
    seed: int = Field(
        0,
        description="Seeds each row's hash, which decides its split: another seed draws other "
        "splits from the same rows.",
    )
    stratify: bool = Field(
        True,
        description="Give every class its share of each split exactly, ranking rows within each "
        "class; false ranks all rows together. A large input places each row by its own hash "
        "instead, which keeps each class's share up to sampling noise either way.",
    )

    @model_validator(mode="after")
    def _leaves_training_rows(self) -> SplitConfig:
        if self.val + self.test >= 1.0:
            raise ValueError(
                f"val + test must be below 1 so rows remain for training, got {self.val + self.test}"
            )
        return self


class DataConfig(Section):
    """Where the rows come from, which columns the model reads and which one it predicts."""

    source: str = Field(
        "builtin:digits",
        description="A Parquet, CSV, JSON lines or NumPy (.npy/.npz) file, folder or glob, as a "
        "local path or a URI (file://, s3://, gs://, ...); an image folder (root/<class>/*.png); "
        "torchvision:MNIST, torchvision:FashionMNIST or torchvision:CIFAR10; builtin:digits, or "
        "builtin:diabetes (a regression: its label_column is target).",
    )
    format: Literal["auto", "parquet", "csv", "json", "numpy", "images"] = Field(
        "auto",
        description="How the source is read; auto: from the files' suffixes (a folder of class "
        "folders of images is images).",
    )
    label_column: str = Field(
        "label",
        description="The column the model learns to predict: a class, or a regression's number. "
        "Image folders and torchvision datasets put each image's class in this column.",
    )
    feature_columns: list[str] | None = Field(
        None, description="The columns the model reads; null: every column but the label."
    )
    categorical_columns: list[str] = Field(
        [],
        description="Features holding categories (strings, or integers that are codes): one-hot "
        "encoded with a vocabulary fitted on the train split.",
    )
    classes: list[int | str] | None = Field(
        None,
        description="The label's classes, in the model's output order; null: the sorted labels "
        "found. A label outside a declared list is an error. Quote them in YAML ('no', 'yes'): "
        "unquoted, no/yes, off/on and false/true are booleans.",
    )
    missing: Literal["fail", "drop"] = Field(
        "fail",
        description="Rows with a missing feature or label (null, NaN, or a blank CSV cell): fail, or "
        "drop them (counted and logged).",
    )
    image_mode: Literal["RGB", "L"] | None = Field(
        None,
        description="How images are read: RGB (3 channels) or L (grayscale, 1 channel); null: the "
        "source's own (RGB for image folders; L for MNIST and FashionMNIST, RGB for CIFAR10).",
    )
    limit: int | None = Field(
        None,
        ge=1,
        description="Read only the first N rows (smoke runs, quick trials); null reads everything.",
    )
    split: SplitConfig = SplitConfig()

    @field_validator("classes", mode="before")
    @classmethod
    def _no_yaml_booleans(cls, value: Any) -> Any:
        """Unquoted no/yes (off/on, false/true) are booleans in YAML, never a class's name."""
        if isinstance(value, list) and any(isinstance(c, bool) for c in value):
            words = {False: "no", True: "yes"}
            quoted = ", ".join(repr(words[c] if isinstance(c, bool) else c) for c in value)
            raise ValueError(
                f"{value} are booleans: YAML reads unquoted no/yes, off/on and false/true as booleans; "
                f"quote each class as the label column writes it, such as classes: [{quoted}]"
            )
        return value

    @model_validator(mode="after")
    def _categorical_are_features(self) -> DataConfig:
        if self.label_column in self.categorical_columns:
            raise ValueError(f"categorical_columns must not hold the label column {self.label_column!r}")
        if self.feature_columns is not None:
            outside = [c for c in self.categorical_columns if c not in self.feature_columns]
            if outside:
                raise ValueError(f"categorical_columns {outside} are not in feature_columns")
        if self.classes is not None and len(set(map(str, self.classes))) != len(self.classes):
            raise ValueError(f"classes must be distinct, got {self.classes}")
        return self


class TokenizerConfig(Section):
    """A Hugging Face tokenizer that turns a text column into a transformer's inputs."""

    name: str | None = Field(
        None,
        description="A tokenizer's model id or local folder; null: the tokenizer of model.kind's hf: model.",
    )
    column: str = Field("text", description="The text column it reads; the model's inputs replace it.")
    max_length: int = Field(
        128,
        ge=1,
        description="Tokens per text: longer texts are cut, shorter ones padded (input_ids, "
        "attention_mask, ... of this length).",
    )


class PreprocessConfig(Section):
    """How the rows become the model's inputs: scaling, image size and augmentation, a
    transform of your own; fitted on the train split and saved with the model."""

    scaler: Literal["standard", "minmax", "none"] = Field(
        "standard",
        description="How numeric features are scaled, fitted on the train split: standard (mean 0, "
        "std 1), minmax (into [0, 1]) or none.",
    )
    image_size: list[int] | None = Field(
        None,
        description="Images (image folders, torchvision datasets): the [height, width] every image "
        "is resized to; null: an hf: model's image processor's size, else the size of the input's "
        "first image.",
    )
    image_mean: list[float] | None = Field(
        None,
        description="Images: the per-channel mean that pixels in [0, 1] are normalized by "
        "(ImageNet's: [0.485, 0.456, 0.406]); null: an hf: model's image processor's, else the "
        "train split's own under scaler standard (0, and a std of 1, under the others).",
    )
    image_std: list[float] | None = Field(
        None,
        description="Images: the per-channel standard deviation pixels are divided by (ImageNet's: "
        "[0.229, 0.224, 0.225]); null: as image_mean's.",
    )
    augment: bool = Field(
        False,
        description="Images: a random crop (4-pixel padding at 32 px) and horizontal flip of the "
        "train split, drawn anew every epoch; evaluation and prediction never augment.",
    )
    transform: str | None = Field(
        None,
        description="A function of your own, package.module:name, fn(batch: pandas.DataFrame) -> "
        "pandas.DataFrame, applied to every batch of a table's rows before the row checks, the "
        "split and the fit: one row out per row in, holding the label column. Its output columns "
        "are the data's: numbers, categories, or fixed-length numeric arrays (token ids, "
        "embeddings). Saved with the model, so prediction takes the raw columns it takes.",
    )
    tokenizer: TokenizerConfig | None = Field(
        None,
        description="Text for a transformer: a Hugging Face tokenizer run on Ray Data while the "
        "data is prepared, its output cached by the tokenizer's identity and saved with the model, "
        "so prediction takes the raw text.",
    )

    @field_validator("image_size")
    @classmethod
    def _height_width(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (len(v) != 2 or min(v) < 1):
            raise ValueError(f"must be [height, width] of positive integers, got {v}")
        return v

    @field_validator("image_std")
    @classmethod
    def _positive(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and min(v, default=0.0) <= 0.0:
            raise ValueError(f"must be positive per channel, got {v}")
        return v

    @model_validator(mode="after")
    def _mean_with_std(self) -> PreprocessConfig:
        if (self.image_mean is None) != (self.image_std is None) or (
            self.image_mean is not None and len(self.image_mean) != len(self.image_std)
        ):
            raise ValueError("image_mean and image_std go together, one number per channel each")
        return self

    @field_validator("transform")
    @classmethod
    def _transform_path(cls, v: str | None) -> str | None:
        return v if v is None else hook_path(v)

    @model_validator(mode="after")
    def _one_transform(self) -> PreprocessConfig:
        if self.transform and self.tokenizer:
            raise ValueError("give transform or tokenizer, not both: the tokenizer is the text's transform")
        return self

    def hooks(self) -> dict[str, str]:
        """The user's callables this section names, by field."""
        return {"preprocess.transform": self.transform} if self.transform else {}
