"""Models, by concern: ``kinds`` (``model.kind`` resolved without torch, and the table of
model kinds' families), ``build`` (the model built, trainflow's own ``mlp`` and ``cnn``,
its weights and frozen prefixes), ``builders`` (torchvision's and the user's builders),
``hf`` (a pretrained Hugging Face transformers model) and ``checkpoint`` (the
self-describing checkpoint folder)."""
