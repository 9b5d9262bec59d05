"""Dataset and task presets: what a config sets for each dataset and task.

A config file builds its `ConfigDict` from `common.base()`, then applies presets:

    config = common.base()
    presets.cifar10(config)

What a dataset is (classes, channels, stored size, source) is its `DatasetSpec` in
`data/specs.py`, written there only: the presets read it and set the rest (resizing,
augmentation, ...). A generated dataset's folder is under the cache folder
(`data/cache_folder.py`).
"""

from typing import Dict, Optional

import ml_collections

from data import cache_folder
from data import specs

# Dataset presets: shapes and the input pipeline of each dataset.


def dataset(config, name: str, *, own_source: bool = False, **choices):
  """Sets `config.dataset` to dataset `name`: its facts from its `DatasetSpec`
  (num_classes, channels; with `own_source`, its source), then `choices`."""
  spec = specs.get_spec(name)
  facts = dict(name=name, num_classes=spec.num_classes, channels=spec.channels)
  if own_source:
    facts['source'] = spec.default_source
  config.dataset.update(dict(facts, **choices))
  return config


def digits(config):
  """scikit-learn's bundled 8x8 handwritten digits: 1437 train / 360 test, no download."""
  return dataset(
    config,
    'digits',
    image_size=specs.get_spec('digits').stored_size,
    augment='none',
    train_split='train',
    eval_split='test',
  )


def mnist(config):
  """MNIST 28x28 resized to 32x32, so patch 4 gives the paper's 64 tokens."""
  return dataset(config, 'mnist', image_size=32, augment='none', shuffle_buffer=60_000)


def cifar10(config):
  return dataset(config, 'cifar10', image_size=32, augment='crop_flip', shuffle_buffer=50_000)


def cifar100(config):
  return dataset(config, 'cifar100', image_size=32, augment='crop_flip', shuffle_buffer=50_000)


def imagenet(config, manual_dir: str = ''):
  """imagenet2012; TFDS needs the downloaded tars in `manual_dir` to prepare it once."""
  return dataset(
    config,
    'imagenet2012',
    image_size=224,
    augment='inception_crop',
    eval_split='validation',
    manual_dir=manual_dir,
    shuffle_buffer=10_000,
  )


def imdb(config, max_length: int = 1024):
  """IMDB reviews as UTF-8 bytes (LRA text task): ids 1..256, 0 = padding."""
  dataset(
    config,
    'imdb_reviews',
    max_length=max_length,
    augment='none',
    image_size=0,
    shuffle_buffer=25_000,
  )
  config.model.kind = 'text'
  return config


def aan(config, data_dir: str = '', max_length: int = 4000):
  """LRA Retrieval: pairs of ACL Anthology Network papers as bytes; is one cited by the other?

  Read from LRA's released `new_aan_pairs.{train,eval,test}.tsv` in `data_dir`
  (no download here); each document cut or padded to `max_length` bytes."""
  dataset(
    config,
    'aan',
    own_source=True,
    data_dir=data_dir,
    max_length=max_length,
    augment='none',
    image_size=0,
    eval_split='validation',
    shuffle_buffer=150_000,
  )
  config.model.kind = 'text'
  return config


def _generated(config, name: str, sizes: Dict[str, int], **choices):
  """A generated LRA task: written once to `cache_folder.lra_cache(name)`, `sizes` examples
  per split."""
  dataset(
    config,
    name,
    own_source=True,
    data_dir=cache_folder.lra_cache(name),
    eval_split='validation',
    **choices,
  )
  config.dataset.sizes = ml_collections.ConfigDict(sizes)
  config.dataset.generator_seed = 0
  config.model.kind = 'text'
  return config


def listops(
  config, sizes: Optional[Dict[str, int]] = None, min_length: int = 500, max_length: int = 2000
):
  """LRA ListOps (generated here): tokens of an expression, its value 0..9 as the label."""
  config = _generated(
    config,
    'listops',
    sizes or {'train': 96_000, 'validation': 2000, 'test': 2000},  # LRA's
    max_length=max_length,
    image_size=0,
    shuffle_buffer=100_000,
  )
  config.dataset.min_length = min_length
  return config


def pathfinder(
  config,
  sizes: Optional[Dict[str, int]] = None,
  contour_length: int = 14,
  image_size: int = 32,
  num_distractors: Optional[int] = None,
):
  """LRA Pathfinder (generated here): 32x32 = 1,024 pixel tokens; are the two discs joined?

  `image_size` and `num_distractors` (default: the generator's, LRA's for 32x32) change
  the images; LRA's task is 32x32."""
  config = _generated(
    config,
    'pathfinder',
    sizes or {'train': 160_000, 'validation': 20_000, 'test': 20_000},
    image_size=image_size,
    pixels_as_tokens=True,
    augment='none',
    shuffle_buffer=200_000,
  )
  config.dataset.contour_length = contour_length
  config.dataset.num_distractors = ml_collections.config_dict.placeholder(int)
  config.dataset.num_distractors = num_distractors
  return config


def mqar(
  config,
  sizes: Optional[Dict[str, int]] = None,
  vocab_size: int = 8192,
  seq_len: int = 128,
  num_kv_pairs: int = 8,
  power_a: float = 0.01,
):
  """Zoology's multi-query associative recall (Arora et al. 2023), generated here
  (`data/mqar.py`) into `cache_folder.cache_dir('mqar')`: `seq_len` tokens, the
  `num_kv_pairs` key-value pairs first, each key queried once later; only the queries
  are scored. The labels are tokens: the model is `sequence_labelling`'s."""
  dataset(
    config,
    'mqar',
    own_source=True,
    data_dir=cache_folder.cache_dir('mqar'),
    max_length=seq_len,
    image_size=0,
    augment='none',
    eval_split='test',
  )
  config.dataset.sizes = ml_collections.ConfigDict(
    sizes or {'train': 100_000, 'validation': 1000, 'test': 1000}
  )
  config.dataset.generator_seed = 0
  config.dataset.vocab_size = vocab_size
  config.dataset.num_kv_pairs = num_kv_pairs
  config.dataset.power_a = power_a
  return sequence_labelling(config)


def sequences(config, data_dir: str = '', vocab_size: int = 0, max_length: int = 0):
  """Any sequence-labelling `.npz` (`inputs`, `labels` int `[n, length]`, label -100 = not
  scored; `data/sequences.py`), tokens 0..vocab_size-1; `data_dir` is the
  file, a '{split}' in it naming one file per split."""
  dataset(
    config,
    'sequences',
    own_source=True,
    data_dir=data_dir,
    max_length=max_length,
    image_size=0,
    augment='none',
  )
  config.dataset.vocab_size = vocab_size
  return sequence_labelling(config)


def text_bytes(
  config, corpus: str = '', seq_len: int = 256, validation_docs: int = 500, train_docs: int = 0
):
  """Byte-level language modelling on a text corpus (`data/text_bytes.py`): `corpus` a
  text file (its paragraphs the documents), a folder of text files, an .npz of documents
  (text_utf8, offsets) or 'builtin:python_docs' (Python's reference docs); `validation_docs`
  documents held out, the rest (the first `train_docs`; 0 = all) trained on, each cut into
  windows of `seq_len` bytes written once to `cache_folder.cache_dir('text_bytes')`. Every byte is
  scored: the task is `byte_lm` (bits per byte; held-out continuations after training)."""
  dataset(
    config,
    'text_bytes',
    own_source=True,
    data_dir=cache_folder.cache_dir('text_bytes'),
    max_length=seq_len,
    image_size=0,
    augment='none',
    eval_split='validation',
    vocab_size=specs.get_spec('text_bytes').vocab_size,
  )
  config.dataset.corpus = corpus
  config.dataset.validation_docs = validation_docs
  config.dataset.train_docs = train_docs
  config.dataset.generator_seed = 0
  sequence_labelling(config)
  config.task = 'byte_lm'
  config.sample = ml_collections.ConfigDict(
    dict(
      num_samples=2,  # held-out documents continued (samples.json, samples.txt)
      prompt_bytes=64,  # their first bytes, given
      new_bytes=128,  # bytes sampled after them
      temperature=0.8,
      seed=0,
    )
  )
  return config


def image_folder(config, root: str = '', image_size: int = 64):
  """A local folder `root/{train,test}/<label>/*.png|jpg` read by `tfds.ImageFolder`.

  No augmentation (flips are wrong for digits and text; set dataset.augment to
  'crop' or 'crop_flip' where they fit); normalisation is measured on the
  training images unless dataset.mean / dataset.std are set.
  """
  return dataset(
    config,
    'image_folder',
    own_source=True,
    data_dir=root,
    image_size=image_size,
    augment='none',
    shuffle_buffer=10_000,
    download=False,
  )


# Task presets.


def sequence_labelling(config):
  """A token predicted at each scored position (label -100: not scored), from the tokens
  before it: the causal model (token embedding, the causal stack, a vocabulary head)
  trained with cross-entropy on the scored positions (`train/tasks/sequence_labelling.py`)."""
  config.task = 'sequence_labelling'
  config.model.kind = 'causal'
  return config


def pixel_lm(config):
  """Autoregressive pixel model (Katharopoulos et al. 2020, section 4.2.1).

  Pixels become tokens 0..255 at the stored size (digits 8x8: 64 steps, MNIST
  28x28: 784), raster order, no resizing or normalisation; a causal Transformer
  predicts each from the ones before. At the end the trainer writes sample
  grids and occluded completions (`sample` group) into the workdir.
  """
  config.task = 'pixel_lm'
  config.model.kind = 'causal'
  config.dataset.update(dict(pixels_as_tokens=True, augment='none', channels=1))
  stored = specs.get_spec(config.dataset.name).stored_size
  if stored:
    config.dataset.image_size = stored
  config.sample = ml_collections.ConfigDict(
    dict(
      num_samples=16,  # unconditional samples in samples.png
      num_completions=8,  # test images completed in samples_completion.png
      rows=0,  # image rows shown to the model (0: half)
      temperature=1.0,
      seed=0,
    )
  )
  return config
