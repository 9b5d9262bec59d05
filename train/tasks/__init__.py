"""The tasks `config.task` can name."""

from train.tasks import byte_lm
from train.tasks import classification
from train.tasks import pixel_lm
from train.tasks import sequence_labelling
from train.tasks.base import Task

TASKS = {
  task.name: task
  for task in (classification.TASK, pixel_lm.TASK, sequence_labelling.TASK, byte_lm.TASK)
}


def get_task(name: str) -> Task:
  if name not in TASKS:
    raise ValueError(f'config.task={name!r} is not valid; valid choices: {", ".join(TASKS)}')
  return TASKS[name]
