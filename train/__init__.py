"""Training: configs in, checkpoints, metrics and results out.

Entry points: `train.trainer.train_and_evaluate(config, workdir)`,
`train.trainer.evaluate(config, workdir)`,
`train.trainer.load_model_and_params(workdir)`.
"""
