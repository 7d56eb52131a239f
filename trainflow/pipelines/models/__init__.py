"""Models, by concern: ``kinds`` (``model.kind`` resolved without torch: torchvision
builders, a user's callable, weights files), ``build`` (the model built, its weights and
frozen prefixes), ``hf`` (a pretrained Hugging Face transformers model) and ``checkpoint``
(the self-describing checkpoint folder)."""
