"""The data's own config checks: `config.dataset` and the files it names.

    dataset = data.check(config)   # the fields alone, nothing read: the resolved Dataset
    data.check_splits(dataset)     # the data itself: prepared, every split read, labels checked

Both raise a one-line ValueError naming the field, the bad value and what is
valid; `train.validate` runs them with the other concerns' checks (as its
ConfigError, the same message).
"""

import os

from configs import fields
from data import arrays
from data import specs
from data import splits
from data import transforms

# What `config.dataset` accepts, field by field (the rules between fields: `check`).
NAME = fields.Field('dataset.name', choices=tuple(specs.DATASETS))
FIELDS = (
  fields.Field('dataset.batch_size', above=0),
  fields.Field('dataset.eval_batch_size', above=0),
)
IMAGE_FIELDS = (
  fields.Field('dataset.image_size', above=0),
  fields.Field('dataset.channels', above=0),
  fields.Field('dataset.augment', choices=specs.AUGMENTATIONS),
)
TOKEN_FIELDS = (fields.Field('dataset.max_length', above=0),)
STREAM_FIELDS = (fields.Field('dataset.shuffle_buffer', above=0, integer=True),)
GENERATED_FIELDS = (fields.Field('dataset.generator_seed', minimum=0, integer=True, default=0),)


def check(config) -> specs.Dataset:
  """ValueError for the first invalid field of `config.dataset` (reads no data); else the
  dataset, resolved (`specs.resolve`)."""
  d = config.dataset
  NAME.check(config)
  dataset = specs.resolve(config)
  spec, src = dataset.spec, dataset.source
  fields.check(
    config,
    FIELDS
    + {
      'image': IMAGE_FIELDS,
      'text': TOKEN_FIELDS,
      'text_pair': TOKEN_FIELDS,
      'tokens': TOKEN_FIELDS,
      'sequence': TOKEN_FIELDS,
    }.get(spec.kind, ()),
  )
  if spec.kind == 'image':
    if d.augment == 'inception_crop' and dataset.in_memory:
      raise ValueError(
        f"config.dataset.augment='inception_crop' is not valid for the "
        f'in-memory dataset {d.name!r} from {src!r}; valid choices: none, '
        f'crop, crop_flip'
      )
    if not d.get('pixels_as_tokens'):  # pixel tokens are not normalised
      specs.normalization(dataset)
  if not dataset.in_memory:  # tf.data's shuffle buffer (0 and -1 fail when it is built)
    fields.check(config, STREAM_FIELDS)
  if src == 'generated':  # the generator's seed and its split sizes (examples per split)
    fields.check(
      config,
      GENERATED_FIELDS
      + tuple(
        fields.Field(f'dataset.sizes.{split}', minimum=0, integer=True)
        for split in (d.get('sizes') or {})
      ),
    )
  if spec.kind == 'sequence':
    _sequence(config, src)
  _packing(config, src)
  if d.num_classes < 0 or (
    d.num_classes == 0
    and spec.num_classes == 0
    and src not in ('folder', 'arrays')
    and spec.kind != 'sequence'
  ):
    raise ValueError(f'config.dataset.num_classes={d.num_classes!r} is not valid; it must be > 0')
  if spec.num_classes and d.num_classes not in (0, spec.num_classes):
    raise ValueError(
      f'config.dataset.num_classes={d.num_classes!r} is not valid for '
      f'{d.name!r}; valid choices: {spec.num_classes}'
    )
  holdout = d.get('holdout', 0.0)
  if not 0.0 <= holdout < 1.0:
    raise ValueError(
      f'config.dataset.holdout={holdout!r} is not valid; it must be in '
      f'[0, 1) (the fraction of the training split held out as validation)'
    )
  if holdout > 0 and not dataset.in_memory:
    raise ValueError(
      f'config.dataset.holdout={holdout} needs an in-memory dataset; '
      f'{d.name!r} from {src!r} streams (hold out files instead)'
    )
  if src in ('folder', 'arrays', 'generated', 'tsv') and not d.data_dir:
    what = {
      'folder': 'the image folder root (root/<split>/<label>/<image>)',
      'arrays': "the .npz file (a '{split}' in it names one file per split)",
      'generated': 'the folder the generated splits are written into',
      'tsv': "the folder of LRA's new_aan_pairs.{train,eval,test}.tsv",
    }[src]
    raise ValueError(
      f"config.dataset.data_dir='' is not valid for dataset {d.name!r} from "
      f'source {src!r}; it must be {what}'
    )
  if (
    src == 'tfds'
    and d.data_dir
    and not d.download
    and not os.path.isdir(d.data_dir)
    and fields.is_local(d.data_dir)
  ):
    raise ValueError(
      f'config.dataset.data_dir={d.data_dir!r} does not exist (and config.dataset.download=False)'
    )
  if (
    spec.manual
    and d.manual_dir
    and not os.path.isdir(d.manual_dir)
    and (fields.is_local(d.manual_dir))
  ):
    raise ValueError(f'config.dataset.manual_dir={d.manual_dir!r} does not exist')
  if d.get('pixels_as_tokens'):
    if spec.kind != 'image':
      raise ValueError(
        f'config.dataset.pixels_as_tokens=True is not valid for the '
        f'{spec.kind} dataset {d.name!r}; it needs an image dataset'
      )
    fields.check(config, (fields.Field('dataset.channels', choices=(1,)),))
  if d.get('transform', '') not in ('', 'none'):
    if spec.kind != 'image':
      raise ValueError(
        f'config.dataset.transform={d.transform!r} is not valid for the '
        f'{spec.kind} dataset {d.name!r}; it needs an image dataset'
      )
    if not dataset.in_memory:
      raise ValueError(
        f'config.dataset.transform={d.transform!r} needs an in-memory '
        f'dataset; {d.name!r} from {src!r} streams'
      )
    try:
      transforms.get_transform(d.transform)
    except ValueError as e:
      raise ValueError(f'config.dataset.transform={d.transform!r} is not valid: {e}') from None
  return dataset


PACKED = ('text_bytes', 'mqar')  # the generated datasets that pack (`packing.py`)


def _packing(config, src: str) -> None:
  """`dataset.packing` (documents packed into rows): a bool, set only where the data
  packs (a sequence file brings its own `segment_ids`)."""
  d = config.dataset
  packing = d.get('packing', False)
  if packing not in (False, True):
    raise ValueError(f'config.dataset.packing={packing!r} is not valid; valid choices: False, True')
  if packing and (d.name not in PACKED or src != 'generated'):
    raise ValueError(
      f'config.dataset.packing=True is not valid for dataset {d.name!r} from {src!r}; the '
      f'generated {", ".join(PACKED)} pack their documents (a sequence .npz brings its '
      f'own segment_ids); valid choices: False'
    )


def _sequence(config, src: str) -> None:
  """A sequence-labelling dataset: its vocabulary (the labels are tokens of it) and, for
  generated MQAR, the generator's settings."""
  d = config.dataset
  vocab = d.get('vocab_size', 0)
  if not isinstance(vocab, int) or vocab <= 0:
    raise ValueError(
      f'config.dataset.vocab_size={vocab!r} is not valid for the sequence '
      f'dataset {d.name!r}; it must be > 0 (token ids 0..vocab_size-1)'
    )
  if d.num_classes not in (0, d.vocab_size):
    raise ValueError(
      f'config.dataset.num_classes={d.num_classes} is not valid for the '
      f'sequence dataset {d.name!r}, whose labels are tokens; valid choices: '
      f'0, {d.vocab_size} (config.dataset.vocab_size)'
    )
  if d.get('holdout', 0.0) > 0:
    raise ValueError(
      f'config.dataset.holdout={d.holdout} is not valid for the sequence '
      f'dataset {d.name!r} (holdout splits by class); valid: 0, with a '
      f"'{{split}}' file per split"
    )
  if src == 'generated' and d.name == 'mqar':
    from data import mqar  # pylint: disable=g-import-not-at-top

    seq_len = d.get('seq_len', 0) or d.max_length
    if not d.get('packing', False) and seq_len != d.max_length:
      raise ValueError(
        f'config.dataset.seq_len={seq_len} is not valid without packing: each MQAR '
        f'sequence is a row of config.dataset.max_length={d.max_length}; valid choices: '
        f'0, {d.max_length} (or config.dataset.packing=True: rows of max_length)'
      )
    try:
      mqar.check_settings(
        d.vocab_size,
        seq_len,
        d.get('num_kv_pairs', mqar.NUM_KV_PAIRS),
        d.get('power_a', mqar.POWER_A),
      )
      mqar.check_row_length(seq_len, d.max_length if d.get('packing', False) else 0)
    except ValueError as e:
      raise ValueError(f'config.dataset: {e}') from None
  if d.name == 'text_bytes':
    from data import text_bytes  # pylint: disable=g-import-not-at-top

    if d.vocab_size != text_bytes.VOCAB_SIZE:
      raise ValueError(
        f'config.dataset.vocab_size={d.vocab_size!r} is not valid for the byte '
        f'dataset {d.name!r}; valid choices: {text_bytes.VOCAB_SIZE}'
      )
    if not d.get('corpus'):
      raise ValueError(
        f"config.dataset.corpus={d.get('corpus', '')!r} is not valid for "
        f'dataset {d.name!r}; it must be an .npz (text_utf8, offsets) or a '
        f'folder of .txt files'
      )
    try:
      text_bytes.check_settings(d.max_length, d.get('validation_docs', 0), d.get('train_docs', 0))
    except ValueError as e:
      raise ValueError(f'config.dataset: {e}') from None


def check_splits(config, training: bool = True) -> None:
  """Prepares the data and checks what it holds, filling in `config.dataset.num_classes`
  when it is 0, and a byte corpus's sha256 as `dataset.corpus_sha256` (what the run
  trains on, stored with it: `train/workdir/identity.py` refuses a resume on other
  text) (`config`, a config or its resolved `specs.Dataset`, is changed: pass a copy).

  Every split the run reads has examples, and in-memory labels lie in
  0..num_classes-1: an empty test split would otherwise fail only at the final
  evaluation, and an out-of-range label give a NaN loss. With `training`, the
  batch fits in the training split (an evaluation may read a file smaller than
  one training batch). ValueError naming the field, file or dataset.
  """
  dataset = specs.resolve(config)
  d = dataset.fields
  splits.prepare(dataset)
  _check_splits(dataset)  # fills in num_classes
  if d.name == 'text_bytes':
    from data import text_bytes  # pylint: disable=g-import-not-at-top

    d.corpus_sha256 = text_bytes.fingerprint(d.corpus)
  train_examples = splits.num_examples(dataset, d.train_split)
  if training and d.batch_size > train_examples:
    raise ValueError(
      f'config.dataset.batch_size={d.batch_size} exceeds the {train_examples} '
      f'examples of split {d.train_split!r}; valid: <= {train_examples}'
    )


def _check_splits(dataset: specs.Dataset) -> None:
  d = dataset.fields
  read = {d.train_split: 'train_split', d.eval_split: 'eval_split'}
  if not dataset.in_memory:  # streamed: counted (an empty train split fails below)
    if dataset.source == 'folder' and d.num_classes > 0:  # a label per folder
      from data import stream  # pylint: disable=g-import-not-at-top

      found = stream.folder_num_classes(d.data_dir)
      if found > d.num_classes:
        raise ValueError(
          f'config.dataset.num_classes={d.num_classes} is not valid for '
          f'{d.data_dir}, which has {found} label folders; valid: '
          f'>= {found}, or 0 (one class per folder)'
        )
    if d.num_classes == 0:
      d.num_classes = splits.num_classes(dataset)
    if splits.num_examples(dataset, d.eval_split) == 0:
      raise ValueError(
        f'config.dataset.eval_split={d.eval_split!r} of dataset {d.name!r} '
        f'holds no examples; a run needs at least one'
      )
    return
  for split, field in read.items():
    arrays.check_split(arrays.get_split(dataset, split), f'config.dataset.{field}={split!r}')
  if dataset.input_kind == 'sequence':  # labels: tokens of the vocabulary, or -100
    from data import sequences  # pylint: disable=g-import-not-at-top

    d.num_classes = d.vocab_size
    for split in read:
      sequences.check(arrays.get_split(dataset, split), d.vocab_size, d.max_length)
    return
  classes = 'config.dataset.num_classes'
  if d.num_classes == 0:
    d.num_classes = splits.num_classes(dataset)
    classes = 'num_classes read from the training labels'
  for split in read:
    arrays.check_labels(
      arrays.get_split(dataset, split), d.num_classes, f'{classes}={d.num_classes}'
    )
