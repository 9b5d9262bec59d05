"""The generated Long Range Arena tasks (ListOps, Pathfinder) as datasets: the 'generated' source.

    pattern = generated.ensure(config)   # writes missing splits into dataset.data_dir
    # -> '<data_dir>/listops_500-2000_<key>_{split}.npz', then read as the 'arrays' source reads it

`config.dataset.data_dir` is the cache folder (local, or a bucket: every file goes
through `files.gfile`, see `npz_cache.py`). The splits are written once
(each generator skips a file whose settings match, so an interrupted
generation resumes) and then read into memory like any `.npz` dataset.
Settings, all optional in `config.dataset`:
  * sizes: {split: examples}, e.g. {'train': 5000, 'validation': 500,
    'test': 500}; default the generator's (LRA's);
  * generator_seed: the seed of the draw (default 0);
  * ListOps: min_length (default 500) and max_length (default 2000): the
    expression lengths, in tokens;
  * Pathfinder: contour_length (6, 9 or 14 dashes, LRA's easy / intermediate /
    hard; default 14), image_size (default 32, LRA's) and num_distractors
    (default the generator's, LRA's 20 // distractor length, which fits 32x32);
  * MQAR: vocab_size, max_length (the sequence length; packed, the row length),
    seq_len (packed: the sequence length), num_kv_pairs, power_a and packing (see
    `mqar.py`);
  * text_bytes: corpus (an .npz of documents or a folder of .txt files),
    max_length (the window, in bytes), validation_docs, train_docs and packing (see
    `text_bytes.py`).
"""

from typing import Any, Dict

from data import listops_files
from data import mqar
from data import npz_cache
from data import pathfinder
from data import specs
from data import text_bytes

NAMES = ('listops', 'pathfinder', 'mqar', 'text_bytes')


def _sizes(d) -> Dict[str, int]:
  sizes = d.get('sizes')
  if not sizes:
    return {}
  return {
    str(k): int(v)
    for k, v in (sizes.to_dict() if hasattr(sizes, 'to_dict') else dict(sizes)).items()
  }


def settings(config) -> Dict[str, Any]:
  """What the generator of `config.dataset.name` is asked for (sizes and task settings);
  `config` may be its resolved `specs.Dataset`."""
  d = specs.resolve(config).fields
  if d.name not in NAMES:
    raise ValueError(f'dataset {d.name!r} is not generated; valid choices: {", ".join(NAMES)}')
  out: Dict[str, Any] = dict(seed=int(d.get('generator_seed', 0)), sizes=_sizes(d) or None)
  if d.name == 'listops':
    out.update(
      min_length=int(d.get('min_length', 0) or 500), max_length=int(d.get('max_length', 0) or 2000)
    )
  elif d.name == 'mqar':
    out.update(
      vocab_size=int(d.vocab_size),
      seq_len=int(d.get('seq_len', 0) or d.max_length),
      num_kv_pairs=int(d.get('num_kv_pairs', mqar.NUM_KV_PAIRS)),
      power_a=float(d.get('power_a', mqar.POWER_A)),
      row_length=int(d.max_length) if d.get('packing', False) else 0,
    )
  elif d.name == 'text_bytes':
    return dict(
      corpus=str(d.get('corpus', '')),
      seq_len=int(d.max_length),
      validation_docs=int(d.get('validation_docs', 0)),
      train_docs=int(d.get('train_docs', 0)),
      seed=out['seed'],
      packing=bool(d.get('packing', False)),
    )
  else:
    out.update(
      contour_length=int(d.get('contour_length', 0) or 14),
      image_size=int(d.get('image_size', 0) or pathfinder.IMAGE_SIZE),
    )
    if d.get('num_distractors') is not None:
      out['num_distractors'] = int(d.num_distractors)
  return out


def pattern(config) -> str:
  """The `.npz` path pattern ('{split}' in it) of the dataset's split files."""
  d, s = specs.resolve(config).fields, settings(config)
  if d.name == 'listops':
    return listops_files.split_path(d.data_dir, '{split}', **s)
  if d.name == 'mqar':
    return mqar.split_path(d.data_dir, '{split}', **s)
  if d.name == 'text_bytes':
    return text_bytes.split_path(d.data_dir, '{split}', **s)
  return pathfinder.split_path(d.data_dir, '{split}', **s)


def ensure(config, verbose: bool = True) -> str:
  """Writes any missing or outdated split file into `dataset.data_dir`; returns `pattern`."""
  d, s = specs.resolve(config).fields, settings(config)
  if not d.data_dir:
    raise ValueError(
      f"config.dataset.data_dir='' is not valid for the generated dataset "
      f'{d.name!r}; it must be the folder to write its splits into'
    )
  npz_cache.makedirs(d.data_dir)
  if d.name == 'listops':
    listops_files.write_splits(
      d.data_dir,
      seed=s['seed'],
      sizes=s['sizes'],
      max_length=s['max_length'],
      min_length=s['min_length'],
      verbose=verbose,
    )
  elif d.name == 'mqar':
    mqar.write_splits(d.data_dir, verbose=verbose, **s)
  elif d.name == 'text_bytes':
    text_bytes.write_splits(d.data_dir, verbose=verbose, **s)
  else:
    options = {k: v for k, v in s.items() if k not in ('seed', 'sizes')}
    pathfinder.write_splits(
      d.data_dir, seed=s['seed'], sizes=s['sizes'], verbose=verbose, **options
    )
  return pattern(config)
