"""Training: configs in, checkpoints, metrics and results out.

The public face is `train.api` (build, load, train_and_evaluate, evaluate, ...),
with the data through `data`'s public functions; the other
modules are the trainer's own. `main.py` runs `train.trainer.train_and_evaluate`.
"""
