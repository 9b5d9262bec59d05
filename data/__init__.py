"""The data package's public face: the input pipeline's one entry point.

    train_data = data.get_train_data(config)   # .num_examples, .steps_per_epoch, .batches(start_step)
    eval_data = data.get_eval_data(config)     # .num_examples, .num_batches, .batches()
    batch = data.get_eval_batch(config)        # one local eval batch, for analysis
    data.check(config)                         # config.dataset's fields (reads nothing)
    data.check_splits(config)                  # the data: every split read, labels checked

Batches are dicts of numpy arrays for this process (its slice of the global
batch): 'inputs' (images `[b, h, w, c]` float32 normalised; text `[b,
max_length]` int32 byte ids, 0 = padding; text pairs `[b, 2, max_length]`;
token tasks `[b, length]` int32;
with `dataset.pixels_as_tokens` pixel tokens `[b, h*w*c]` int32 0..255 in
raster order; sequence labelling `[b, max_length]` int32), 'label' `[b]` int32
(sequence labelling: `[b, k, 2]`, the (position, token) of each scored position,
k the most in one sequence of the split, padded with (0, -100); see
`sequences.scored`) and 'mask' `[b]` float32 (0 for the padding rows that
complete the last eval batch).

Where the examples come from (`dataset.source`) and what the dataset is
(`dataset.name`) are independent; see `data/specs.py`. Small datasets
are decoded once into memory (`memory.py`), large ones stream (`stream.py`).
In both, the training batch of step s is a pure function of (seed, s, process
count), so a run resumed at step s sees exactly what an uninterrupted run sees.
"""
from typing import Optional

import jax

from data import memory
from data import specs
from data.checks import check, check_splits  # pylint: disable=unused-import
from data.specs import get_spec, input_kind, source, TEXT_VOCAB_SIZE  # pylint: disable=unused-import


class DownloadError(RuntimeError):
  """TFDS could not download a dataset (no network, or the server refused)."""


def _processes(process_index: Optional[int], process_count: Optional[int]):
  return (jax.process_index() if process_index is None else process_index,
          jax.process_count() if process_count is None else process_count)


def get_train_data(config, *, process_index: Optional[int] = None,
                   process_count: Optional[int] = None):
  """The endless training stream of this process (defaults: jax.process_index/count)."""
  pid, count = _processes(process_index, process_count)
  if specs.in_memory(config):
    return memory.TrainData(config, pid, count)
  from data import stream  # pylint: disable=g-import-not-at-top
  return stream.TrainData(config, pid, count)


def get_eval_data(config, split: str = '', *, process_index: Optional[int] = None,
                  process_count: Optional[int] = None):
  """Evaluation batches of `split` (default `config.dataset.eval_split`): every
  example once over the processes, padding rows with mask 0."""
  split = split or config.dataset.eval_split
  pid, count = _processes(process_index, process_count)
  if specs.in_memory(config):
    return memory.EvalData(config, split, pid, count)
  from data import stream  # pylint: disable=g-import-not-at-top
  return stream.EvalData(config, split, pid, count)


def get_eval_batch(config, split: str = ''):
  """The first local evaluation batch of `config`'s dataset (numpy dict)."""
  return next(iter(get_eval_data(config, split).batches()))


def num_classes(config) -> int:
  """`config.dataset.num_classes`, or the count read from the data when it is 0."""
  if config.dataset.num_classes > 0:
    return config.dataset.num_classes
  spec = get_spec(config.dataset.name)
  if spec.kind == 'sequence':  # the labels are tokens
    return vocab_size(config)
  if spec.num_classes:
    return spec.num_classes
  if specs.in_memory(config):
    from data import arrays  # pylint: disable=g-import-not-at-top
    return int(arrays.get_split(config, config.dataset.train_split).labels.max()) + 1
  from data import stream  # pylint: disable=g-import-not-at-top
  return stream.folder_num_classes(config)


def num_examples(config, split: str) -> int:
  """The number of examples of `split` (all processes together)."""
  if specs.in_memory(config):
    from data import arrays  # pylint: disable=g-import-not-at-top
    return len(arrays.get_split(config, split))
  from data import stream  # pylint: disable=g-import-not-at-top
  return stream.Source(config, split, 0, 1, drop_remainder=False).num_examples


def vocab_size(config) -> int:
  """Token ids of a token task are 0..vocab_size-1 (0 = padding; sequence labelling:
  `dataset.vocab_size`, no padding id)."""
  size = get_spec(config.dataset.name).vocab_size or config.dataset.get('vocab_size', 0)
  if not size:
    raise ValueError(f'dataset {config.dataset.name!r} is not a token task')
  return size


def prepare(config) -> None:
  """Makes sure the data can be read (TFDS download_and_prepare when allowed).

  Raises ValueError naming the field (data_dir, manual_dir, download, source,
  split) when the data is missing or cannot be prepared, and DownloadError when
  TFDS cannot download it. Call before any training work.
  """
  src = source(config)
  if src == 'tfds' or src == 'folder':
    from data import stream  # pylint: disable=g-import-not-at-top
    stream.prepare(config)
  if specs.in_memory(config):
    from data import arrays  # pylint: disable=g-import-not-at-top
    for split in (config.dataset.train_split, config.dataset.eval_split):
      arrays.get_split(config, split)
