"""The data package's public face: the input pipeline's one entry point.

    train_data = data.get_train_data(config)  # .num_examples, .steps_per_epoch, .batches(step)
    eval_data = data.get_eval_data(config)     # .num_examples, .num_batches, .batches()
    batch = data.get_eval_batch(config)        # one local eval batch, for analysis
    dataset = data.check(config)               # config.dataset's fields (reads nothing)
    data.check_splits(dataset)                 # the data: every split read, labels checked

Each function takes a config or its dataset resolved once (`data.resolve(config)`, a
`Dataset`: the spec, source and input kind worked out, with `config.dataset`), which is
what the trainer hands the pipeline instead of the whole config.

Batches are dicts of numpy arrays for this process (its slice of the global
batch): 'inputs' (images `[b, h, w, c]` float32 normalised; text `[b,
max_length]` int32 byte ids, 0 = padding; text pairs `[b, 2, max_length]`;
token tasks `[b, length]` int32;
with `dataset.pixels_as_tokens` pixel tokens `[b, h*w*c]` int32 0..255 in
raster order; sequence labelling `[b, max_length]` int32), 'label' `[b]` int32
(sequence labelling: `[b, k, 2]`, the (position, token) of each scored position,
k the most in one sequence of the split, padded with (0, -100); see
`sequences.scored`) and 'mask' `[b]` float32 (0 for the padding rows that
complete the last eval batch); packed sequences (`packing.py`) also 'segment_ids'
`[b, max_length]` int32, the document of each token, 0 for padding.

Where the examples come from (`dataset.source`) and what the dataset is
(`dataset.name`) are independent; see `data/specs.py`. Small datasets
are decoded once into memory (`memory.py`), large ones stream (`stream.py`).
In both, the training batch of step s is a pure function of (seed, s, process
count), so a run resumed at step s sees exactly what an uninterrupted run sees.
"""

from typing import List, Optional, Tuple

import jax

from data import memory
from data import specs
from data.checks import check  # pylint: disable=unused-import
from data.checks import check_splits  # pylint: disable=unused-import
from data.packing import fill as packed_fill  # pylint: disable=unused-import
from data.packing import pack  # pylint: disable=unused-import
from data.specs import TEXT_VOCAB_SIZE  # pylint: disable=unused-import
from data.specs import Dataset  # pylint: disable=unused-import
from data.specs import DownloadError  # pylint: disable=unused-import
from data.specs import get_spec  # pylint: disable=unused-import
from data.specs import input_kind  # pylint: disable=unused-import
from data.specs import resolve  # pylint: disable=unused-import
from data.specs import source  # pylint: disable=unused-import
from data.splits import num_classes  # pylint: disable=unused-import
from data.splits import num_examples  # pylint: disable=unused-import
from data.splits import prepare  # pylint: disable=unused-import
from data.splits import vocab_size  # pylint: disable=unused-import
from data.text_bytes import BUILTIN as BUILTIN_CORPUS  # pylint: disable=unused-import
from data.text_bytes import packed as packed_windows  # pylint: disable=unused-import
from data.text_bytes import read_corpus  # pylint: disable=unused-import
from data.text_bytes import windows as byte_windows  # pylint: disable=unused-import


def arrays_source(config) -> Optional[Tuple[List[str], str]]:
  """How `config`'s dataset is read from `.npz` files instead (`source='arrays'`), for
  messages: (the --config.dataset.* flags, with a '<folder>' placeholder; the files and
  keys they read), or None for a dataset of another kind than images or text.

  cifar10: (['--config.dataset.source=arrays',
  '--config.dataset.data_dir=<folder>/cifar10_{split}.npz'], 'cifar10_train.npz and
  cifar10_test.npz, each with x: uint8 [n, 32, 32, 3] and y: int labels [n]').
  """
  d, spec = config.dataset, get_spec(config.dataset.name)
  if spec.kind == 'image' and spec.stored_size:
    shape = [spec.stored_size] * 2 + ([spec.channels] if spec.channels > 1 else [])
    keys = f'x: uint8 [n, {", ".join(map(str, shape))}]'
  elif spec.kind == 'text':
    keys = (
      "text_utf8: uint8 (the texts' UTF-8 bytes, one after another), "
      'offsets: int [n + 1] (where each text starts)'
    )
  else:
    return None
  splits = ' and '.join(
    f'{spec.name}_{s}.npz' for s in dict.fromkeys((d.train_split, d.eval_split))
  )
  return (
    [
      '--config.dataset.source=arrays',
      f'--config.dataset.data_dir=<folder>/{spec.name}_{{split}}.npz',
    ],
    f'{splits}, each with {keys} and y: int labels [n]',
  )


def _processes(process_index: Optional[int], process_count: Optional[int]):
  return (
    jax.process_index() if process_index is None else process_index,
    jax.process_count() if process_count is None else process_count,
  )


def get_train_data(
  config, *, process_index: Optional[int] = None, process_count: Optional[int] = None
):
  """The endless training stream of this process (defaults: jax.process_index/count)."""
  dataset = resolve(config)
  pid, count = _processes(process_index, process_count)
  if dataset.in_memory:
    return memory.TrainData(dataset, pid, count)
  from data import stream  # pylint: disable=g-import-not-at-top

  return stream.TrainData(dataset, pid, count)


def get_eval_data(
  config,
  split: str = '',
  *,
  process_index: Optional[int] = None,
  process_count: Optional[int] = None,
  row_multiple: int = 1,
):
  """Evaluation batches of `split` (default `config.dataset.eval_split`): every
  example once over the processes, padding rows with mask 0. Each process's batch
  holds its share of `eval_batch_size` rounded up to a multiple of `row_multiple`
  (the devices its rows are split over), so any eval batch size fits any mesh."""
  dataset = resolve(config)
  split = split or dataset.fields.eval_split
  pid, count = _processes(process_index, process_count)
  if dataset.in_memory:
    return memory.EvalData(dataset, split, pid, count, row_multiple)
  from data import stream  # pylint: disable=g-import-not-at-top

  return stream.EvalData(dataset, split, pid, count, row_multiple)


def get_eval_batch(config, split: str = ''):
  """The first local evaluation batch of `config`'s dataset (numpy dict)."""
  return next(iter(get_eval_data(config, split).batches()))
