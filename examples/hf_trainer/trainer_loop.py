"""A Hugging Face ``transformers.Trainer`` as trainflow's ``train.loop``, written as Ray's
guide writes it (Get Started with Distributed Training using Hugging Face Transformers):
``prepare_trainer`` feeds the Trainer from the Ray Data shards, ``RayTrainReportCallback``
reports each checkpoint the Trainer saves. Changed from the guide only where it reads its
model, data and settings from the config trainflow gives it.

trainflow prepares and tokenizes the text (``preprocess.tokenizer``), runs the
``TorchTrainer``, and evaluates, gates and registers the best checkpoint: the Trainer's
``save_pretrained`` folder loads into ``model.kind``'s model as a ``model.pt`` would.
"""

import math

import numpy as np
import ray.train
import torch
import transformers
from ray.train.huggingface.transformers import RayTrainReportCallback, prepare_trainer
from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments
from transformers.trainer_callback import PrinterCallback


def collate(batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """A prepared batch (the tokenizer's inputs and ``label``) as the model takes it."""
    inputs = {name: torch.as_tensor(values) for name, values in batch.items() if name != "label"}
    inputs["labels"] = torch.as_tensor(batch["label"])
    return inputs


def accuracy(prediction) -> dict[str, float]:
    return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}


def train_func(config: dict) -> None:
    transformers.logging.set_verbosity_error()  # the new head's load report, on every worker
    run = config["trainflow"]
    hf = run["model_spec"]["hf"]  # the pretrained model's folder, its head sized for the data
    labels = {int(i): name for i, name in hf["config"]["id2label"].items()}
    model = AutoModelForSequenceClassification.from_pretrained(
        hf["source"], num_labels=len(labels), id2label=labels, label2id=hf["config"]["label2id"]
    )

    # [1] The Ray Data shards, as batches of tensors.
    batch_size = config["batch_size"]
    train = ray.train.get_dataset_shard("train").iter_torch_batches(batch_size=batch_size, collate_fn=collate)
    val = ray.train.get_dataset_shard("val").iter_torch_batches(batch_size=batch_size, collate_fn=collate)
    # An iterable dataset has no length: the Trainer counts in steps.
    workers = ray.train.get_context().get_world_size()
    steps_per_epoch = math.ceil(run["rows"]["train"] / (batch_size * workers))

    # [2] The Trainer, as a script of your own would make it.
    args = TrainingArguments(
        output_dir="output",
        max_steps=steps_per_epoch * config["epochs"],
        per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=batch_size,
        learning_rate=config["lr"],
        weight_decay=config.get("weight_decay", 0.01),
        eval_strategy="steps",
        eval_steps=steps_per_epoch,
        save_strategy="steps",
        save_steps=steps_per_epoch,
        logging_strategy="steps",
        logging_steps=steps_per_epoch,
        save_total_limit=1,
        report_to="none",
        disable_tqdm=True,
        ddp_find_unused_parameters=False,
        use_cpu=not torch.cuda.is_available(),
        seed=config["seed"],
    )
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=val, compute_metrics=accuracy)

    # [3] Report each checkpoint the Trainer saves to Ray Train (trainflow's log shows each
    # report, in place of the Trainer's printed logs); feed it from Ray Data.
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(RayTrainReportCallback())
    trainer = prepare_trainer(trainer)
    trainer.train()
