"""Data preparation, by concern: ``sources`` (where data lives: paths, URIs, globs, formats,
torchvision datasets), ``schema`` (a source's columns, types and fingerprint, checked
without reading rows: ``SourceInfo``, ``DataError``), ``readers`` (a source's fragments,
a batch at a time), ``split`` (train/val/test), ``stats`` (row checks and fitted
statistics), ``preprocess`` (the fitted ``Preprocessor``), ``prepare`` (the passes over
the rows), ``runner`` (where the passes run) and ``entry`` (the prepared splits in the
cache)."""
