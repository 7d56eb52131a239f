"""Data preparation, by concern: ``sources`` (where data lives: paths, URIs, globs, formats,
torchvision datasets), ``schema`` (a source's columns, types and fingerprint, checked
without reading rows: ``SourceInfo``, ``DataError``), ``missing`` (what counts as a missing
value), ``readers`` (a source's fragments, a batch at a time), ``transform`` and
``tokenizer`` (a user's batch transform, a Hugging Face tokenizer), ``split``
(train/val/test), ``stats`` (row checks and fitted statistics), ``preprocess`` (the fitted
``Preprocessor``), ``profile`` (the train split's profile, drift's reference), ``prepare``
(the passes over the rows), ``runner`` (where the passes run), ``tensors`` (a tensor per
row in Parquet) and ``entry`` (the prepared splits in the cache)."""
