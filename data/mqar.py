"""Multi-query associative recall (MQAR; Arora et al. 2023, "Zoology"), generated and cached.

    inputs, labels = mqar.generate(1000, seed=(0, 1), vocab_size=8192, seq_len=128,
                                   num_kv_pairs=8)
    paths = mqar.write_splits(folder, seed=0, sizes={'train': 20_000, 'test': 1000}, ...)

One example, `seq_len` tokens (Zoology's definition, their
`multiquery_ar` generator with one pass over the pairs):

  * keys come from the lower half of the vocabulary, 1..vocab_size/2-1, and
    values from the upper half, vocab_size/2..vocab_size-1; an example's
    `num_kv_pairs` keys are distinct, and so are its values;
  * the pairs open the sequence: k_1 v_1 k_2 v_2 ... (2 * num_kv_pairs tokens);
  * every key is queried once after them: the rest of the sequence has
    (seq_len - 2 * num_kv_pairs) / 2 even slots, and the queries take
    `num_kv_pairs` distinct slots, slot g (0-based) drawn with weight
    a * (g + 1)^(a - 1), a = `power_a` (a power law: most queries soon after
    the pairs, a few far away; a = 1 is uniform);
  * every other position is filler, a token drawn uniformly from the whole
    vocabulary;
  * a query position is scored: its label is the value paired with its key
    (the next token a model must predict); every other label is -100.

So `inputs` int `[n, seq_len]` and `labels` int `[n, seq_len]`, the
sequence-labelling format (`sequences.py`). The draw is a pure function of
the seed (numpy's PCG64), the same on every machine.

`write_splits` writes one `.npz` file per split, each from its own seed
(`split_seed`) and excluding every sequence of the splits before it, so no
sequence is in two splits; a file whose settings match is kept, so the
splits are generated once. A file's name holds a key of every split's settings
(`split_path`: the seed and the sizes too), so runs of other sizes or seeds beside
each other in one cache folder each keep their own files. A file that is damaged (truncated, or its
bytes changed) or holds another number of rows than its settings say is written
again, with one line saying so (`npz_cache.problem`).
"""

import math
import os
from typing import Dict, List, Optional, Set, Tuple
import zlib

import numpy as np

from data import npz_cache
from data import packing

DEFAULT_SIZES = {'train': 20_000, 'validation': 1000, 'test': 1000}  # Zoology's (128, 8)
NUM_KV_PAIRS, POWER_A = 8, 0.01  # Zoology's defaults
_FORMAT = 1  # bump when the generated content changes for the same settings
_CHUNK = 4096  # rows drawn at a time (bounds the memory of the gap draw)


def check_settings(vocab_size: int, seq_len: int, num_kv_pairs: int, power_a: float) -> None:
  """A one-line ValueError naming the first setting the task cannot be built with."""
  if num_kv_pairs < 1:
    raise ValueError(f'MQAR num_kv_pairs={num_kv_pairs} is not valid; it must be >= 1')
  if seq_len < 4 * num_kv_pairs:
    raise ValueError(
      f'MQAR seq_len={seq_len} is too short for num_kv_pairs={num_kv_pairs}: '
      f'the pairs take {2 * num_kv_pairs} tokens and the queries need '
      f'{num_kv_pairs} slots of 2 after them; valid: seq_len >= '
      f'{4 * num_kv_pairs}'
    )
  if vocab_size // 2 - 1 < num_kv_pairs:
    raise ValueError(
      f'MQAR vocab_size={vocab_size} is too small for num_kv_pairs='
      f'{num_kv_pairs} distinct keys (ids 1..vocab_size/2-1); valid: '
      f'vocab_size >= {2 * num_kv_pairs + 2}'
    )
  if not 0 < power_a < math.inf:
    raise ValueError(
      f'MQAR power_a={power_a} is not valid; it must be a finite number > 0 (1 = uniform gaps)'
    )


def gap_weights(num_slots: int, power_a: float) -> np.ndarray:
  """float64 `[num_slots]`: the chance that one query takes slot g, a (g + 1)^(a - 1),
  normalised."""
  p = power_a * np.arange(1, num_slots + 1, dtype=np.float64) ** (power_a - 1)
  return p / p.sum()


def _distinct(rng: np.random.Generator, n: int, low: int, high: int, k: int) -> np.ndarray:
  """int64 `[n, k]`: k distinct values of low..high-1 per row, uniform (and in random order)."""
  size = high - low
  if k * k > 4 * size:  # many collisions: rank a random matrix (size is small here)
    return np.argsort(rng.random((n, size)), axis=1)[:, :k] + low
  out = rng.integers(low, high, (n, k))
  todo = np.arange(n)
  while len(todo):  # redraw the rows with a repeat (rejection: uniform over distinct rows)
    s = np.sort(out[todo], axis=1)
    todo = todo[(s[:, 1:] == s[:, :-1]).any(axis=1)]
    out[todo] = rng.integers(low, high, (len(todo), k))
  return out


def _draw(
  rng: np.random.Generator, n: int, vocab_size: int, seq_len: int, num_kv_pairs: int, power_a: float
) -> Tuple[np.ndarray, np.ndarray]:
  """`n` examples (see the module docstring): (inputs, labels) int32 `[n, seq_len]`."""
  half, context = vocab_size // 2, 2 * num_kv_pairs
  keys = _distinct(rng, n, 1, half, num_kv_pairs)
  values = _distinct(rng, n, half, vocab_size, num_kv_pairs)
  num_slots = (seq_len - context) // 2
  # Weighted draw of distinct slots (Gumbel top-k: the same law as drawing one slot
  # after another without replacement).
  scores = np.log(gap_weights(num_slots, power_a)) + rng.gumbel(size=(n, num_slots))
  slots = np.argsort(-scores, axis=1)[:, :num_kv_pairs]
  inputs = rng.integers(0, vocab_size, (n, seq_len))
  labels = np.full((n, seq_len), -100, np.int64)
  rows = np.arange(n)[:, None]
  inputs[:, 0:context:2], inputs[:, 1:context:2] = keys, values
  where = context + 2 * slots
  inputs[rows, where] = keys
  labels[rows, where] = values
  return inputs.astype(np.int32), labels.astype(np.int32)


def fingerprint(row: np.ndarray) -> bytes:
  """A sequence's identity, for keeping the splits disjoint."""
  return np.ascontiguousarray(row, np.int32).tobytes()


def generate(
  num_examples: int,
  seed,
  vocab_size: int = 8192,
  seq_len: int = 128,
  num_kv_pairs: int = NUM_KV_PAIRS,
  power_a: float = POWER_A,
  exclude: Optional[Set[bytes]] = None,
) -> Tuple[np.ndarray, np.ndarray]:
  """(inputs, labels) int32 `[num_examples, seq_len]`, drawn from `seed` (an int or a tuple
  of ints), no row of `inputs` in `exclude` (`fingerprint`s; drawn again instead)."""
  check_settings(vocab_size, seq_len, num_kv_pairs, power_a)
  rng = np.random.default_rng(seed)
  exclude = exclude or set()
  parts: List[Tuple[np.ndarray, np.ndarray]] = []
  have, fruitless = 0, 0
  while have < num_examples:
    x, y = _draw(rng, min(_CHUNK, num_examples - have), vocab_size, seq_len, num_kv_pairs, power_a)
    if exclude:
      keep = np.asarray([fingerprint(r) not in exclude for r in x], bool)
      x, y = x[keep], y[keep]
      fruitless = 0 if len(x) else fruitless + 1
      if fruitless == 100:
        raise ValueError(
          f'MQAR: cannot draw {num_examples} sequences outside the '
          f'{len(exclude)} of the splits before (vocab_size={vocab_size}, '
          f'seq_len={seq_len}, num_kv_pairs={num_kv_pairs} allow too few); '
          f'use fewer examples or a larger vocabulary or sequence'
        )
    parts.append((x, y))
    have += len(x)
  if not parts:
    return (np.zeros((0, seq_len), np.int32),) * 2
  return tuple(np.concatenate(a) for a in zip(*parts))


def split_seed(seed: int, split: str) -> Tuple[int, int]:
  """The seed of one split: (seed, crc32 of its name), so splits draw independently."""
  return (int(seed), zlib.crc32(split.encode('utf-8')))


def split_settings(
  seed: int,
  sizes: Optional[Dict[str, int]],
  vocab_size: int,
  seq_len: int,
  num_kv_pairs: int,
  power_a: float,
  row_length: int = 0,
) -> Dict[str, dict]:
  """{split: the settings its file is written from}, in the order of `sizes` (default
  `DEFAULT_SIZES`): each split's own seed and size, and the splits before it, which it
  excludes. `row_length` (0: none) is named only when the sequences are packed."""
  sizes = dict(DEFAULT_SIZES if sizes is None else sizes)
  task = dict(
    vocab_size=int(vocab_size),
    seq_len=int(seq_len),
    num_kv_pairs=int(num_kv_pairs),
    power_a=float(power_a),
    **({'row_length': int(row_length)} if row_length else {}),
  )
  names = list(sizes)
  return {
    split: {
      'format': _FORMAT,
      'seed': int(seed),
      'split': split,
      'num_examples': int(sizes[split]),
      'excludes': [[b, int(sizes[b])] for b in names[:i]],
      **task,
    }
    for i, split in enumerate(names)
  }


def split_path(
  folder: str,
  split: str,
  vocab_size: int,
  seq_len: int,
  num_kv_pairs: int,
  power_a: float,
  seed: int = 0,
  sizes: Optional[Dict[str, int]] = None,
  row_length: int = 0,
) -> str:
  """`folder/mqar_v<vocab>_l<seq_len>_kv<pairs>_a<power_a>[_r<row_length>]_<key>_{split}.npz`,
  `<key>` the `npz_cache.settings_key` of every split's settings (`split_settings`: seed
  and sizes included), so runs of other settings sharing the folder never overwrite each
  other's files."""
  key = npz_cache.settings_key(
    split_settings(seed, sizes, vocab_size, seq_len, num_kv_pairs, power_a, row_length)
  )
  rows = f'_r{row_length}' if row_length else ''
  return os.path.join(
    folder, f'mqar_v{vocab_size}_l{seq_len}_kv{num_kv_pairs}_a{power_a:g}{rows}_{key}_{split}.npz'
  )


def check_row_length(seq_len: int, row_length: int) -> None:
  """A one-line ValueError when packed rows of `row_length` cannot hold a sequence."""
  if row_length and row_length < seq_len:
    raise ValueError(
      f'MQAR row_length={row_length} cannot hold a sequence of seq_len={seq_len}; valid: '
      f'row_length >= {seq_len} (0: one sequence a row, unpacked)'
    )


def sequences_of(path: str, seq_len: int) -> np.ndarray:
  """The `inputs` of every sequence in a split file, `[n, seq_len]`: its rows, or the
  documents of its packed rows (`segment_ids`)."""
  inputs = npz_cache.read_array(path, 'inputs')
  if inputs.shape[1] == seq_len:
    return inputs
  segment_ids = npz_cache.read_array(path, 'segment_ids')
  return np.stack([inputs[r, a:b] for r, a, b in packing.spans(segment_ids)])


def write_splits(
  folder: str,
  seed: int = 0,
  sizes: Optional[Dict[str, int]] = None,
  vocab_size: int = 8192,
  seq_len: int = 128,
  num_kv_pairs: int = NUM_KV_PAIRS,
  power_a: float = POWER_A,
  row_length: int = 0,
  verbose: bool = True,
) -> List[str]:
  """Writes the `split_path` file of each split; skips files already up to date.

  Each file holds `inputs` and `labels` (int32 `[n, seq_len]`, see the module
  docstring) and `settings_json` (uint8 bytes of the JSON generation settings). With
  `row_length` (0: none), the sequences are packed in order, row_length // seq_len to a
  row (`packing.pack`): `inputs`, `labels` and `segment_ids` `[rows, row_length]`.
  Splits are generated in the order of `sizes`, each from `split_seed(seed, split)`
  and excluding the sequences of the splits before it, so they are disjoint. A damaged
  file, or one of another shape than its settings say, is rebuilt with one line saying
  why, whatever `verbose` says.

  Returns:
    The paths of the split files, in the order of `sizes`.
  """
  check_settings(vocab_size, seq_len, num_kv_pairs, power_a)
  check_row_length(seq_len, row_length)
  sizes = dict(DEFAULT_SIZES if sizes is None else sizes)
  npz_cache.check_sizes(sizes)
  task = dict(vocab_size=vocab_size, seq_len=seq_len, num_kv_pairs=num_kv_pairs, power_a=power_a)
  names = list(sizes)
  settings = split_settings(seed, sizes, row_length=row_length, **task)
  npz_cache.makedirs(folder)
  paths = {
    s: split_path(folder, s, seed=seed, sizes=sizes, row_length=row_length, **task) for s in names
  }
  per_row = row_length // seq_len if row_length else 1
  shape = lambda s: (-(-sizes[s] // per_row), row_length or seq_len)  # of every array
  arrays = ('inputs', 'labels') + (('segment_ids',) if row_length else ())
  why = {
    s: npz_cache.problem(paths[s], settings[s], {name: shape(s) for name in arrays}) for s in names
  }
  todo = [s for s in names if why[s]]
  exclude: Set[bytes] = set()
  for i, split in enumerate(names):
    feeds_later = any(s in todo for s in names[i + 1 :])  # a later split must avoid this one
    if split in todo:
      inputs, labels = generate(sizes[split], split_seed(seed, split), exclude=exclude, **task)
      rows = dict(inputs=inputs, labels=labels)
      if row_length:
        rows = dict(zip(arrays, packing.pack(list(zip(inputs, labels)), row_length)))
      npz_cache.save_npz(
        paths[split],
        **rows,
        settings_json=npz_cache.settings_json(settings[split]),
      )
      packed = f', packed {per_row} to a row of {row_length}' if row_length else ''
      npz_cache.report_written(
        paths[split], why[split], f'{len(inputs)} MQAR examples written{packed}', verbose
      )
    else:  # up to date (read whenever the data is opened: no message)
      inputs = sequences_of(paths[split], seq_len) if feeds_later else ()
    if feeds_later:
      exclude.update(fingerprint(row) for row in inputs)
  return [paths[s] for s in names]
