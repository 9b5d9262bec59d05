"""Reader for the Retrieval task of Long Range Arena (Tay et al., 2021).

The task pairs papers of the ACL Anthology Network (AAN; Radev et al., 2013)
and asks whether one cites the other. LRA releases it as
`new_aan_pairs.train.tsv`, `new_aan_pairs.eval.tsv` and
`new_aan_pairs.test.tsv` (in lra_release/.../tsv_data/), which LRA's
`lra_benchmarks/matching/input_pipeline.py` reads with
`make_csv_dataset(column_names=['label', 'id1', 'id2', 'text1', 'text2'],
field_delim='\\t', use_quote_delim=False, header=False)`. So a line is

  label <TAB> id1 <TAB> id2 <TAB> text1 <TAB> text2

with no header, a numeric label (1: citation link, 0: none; read as a
float) and quotes as ordinary characters.

The text fields of the released files appear to be Python bytes literals
(b'...', with backslash escapes), judging by third-party readers that
`ast.literal_eval` them. LRA does not undo this: its byte-level models read
the literal characters, prefix and escapes included (cut to 10,000 bytes,
then to `max_length` = 4,000 byte tokens per document). `read_tsv` therefore
returns the field bytes unchanged by default; `unescape=True` returns the
bytes a b'...' literal stands for.
"""

import ast
import types
from typing import Dict, Iterator, List, Tuple

from etils import epath
import numpy as np

from data import npz_cache

COLUMNS = ('label', 'id1', 'id2', 'text1', 'text2')
SPLIT_FILES = types.MappingProxyType(
  {
    'train': 'new_aan_pairs.train.tsv',
    'validation': 'new_aan_pairs.eval.tsv',
    'test': 'new_aan_pairs.test.tsv',
  }
)


def _unescape(field: bytes, where: str) -> bytes:
  """The bytes that a b'...' literal field stands for; anything else is a ValueError."""
  try:
    value = ast.literal_eval(field.decode('ascii'))
  except (UnicodeDecodeError, ValueError, SyntaxError) as e:
    raise ValueError(
      f"{where}: with unescape=True texts must be bytes literals b'...', got {field[:40]!r}"
    ) from e
  if not isinstance(value, bytes):
    raise ValueError(
      f"{where}: with unescape=True texts must be bytes literals b'...', got {field[:40]!r}"
    )
  return value


def _rows(path: str, unescape: bool) -> Iterator[Tuple[int, bytes, bytes]]:
  """(label, text1, text2) per non-empty line of an LRA AAN TSV file."""
  with epath.Path(path).open('rb') as f:
    for lineno, line in enumerate(f, 1):
      line = line.rstrip(b'\r\n')
      if not line.strip():
        continue
      where = f'{path}:{lineno}'
      fields = line.split(b'\t')
      if len(fields) != len(COLUMNS):
        raise ValueError(
          f'{where}: expected {len(COLUMNS)} tab-separated fields {COLUMNS}, got {len(fields)}'
        )
      try:
        label = float(fields[0])
      except ValueError as e:
        raise ValueError(f'{where}: label must be 0 or 1, got {fields[0][:20]!r}') from e
      if label not in (0.0, 1.0):
        raise ValueError(f'{where}: label must be 0 or 1, got {fields[0][:20]!r}')
      text1, text2 = fields[3], fields[4]
      if unescape:
        text1, text2 = _unescape(text1, where), _unescape(text2, where)
      yield int(label), text1, text2


def read_tsv(path: str, unescape: bool = False) -> Tuple[List[bytes], List[bytes], np.ndarray]:
  """Reads one LRA AAN TSV file.

  Args:
    path: e.g. `.../tsv_data/new_aan_pairs.train.tsv`.
    unescape: turn b'...' literal fields into the bytes they stand for
      (default: keep the field bytes, which is what LRA's models read).

  Returns:
    text1: list of n bytes, the first document of each pair.
    text2: list of n bytes, the second document.
    labels: int64 `[n]`, 1 if the papers are linked by a citation, else 0.
  """
  text1, text2, labels = [], [], []
  for label, a, b in _rows(path, unescape):
    labels.append(label)
    text1.append(a)
    text2.append(b)
  return text1, text2, np.asarray(labels, np.int64)


def tsv_to_npz(path: str, out_path: str, unescape: bool = False) -> str:
  """Converts one LRA AAN TSV file to a numpy archive; returns `out_path`.

  Keys: `text_utf8` (uint8 `[total bytes]`) and `offsets` (int64 `[n + 1]`),
  so text1 of pair i is `text_utf8[offsets[i]:offsets[i + 1]]`; likewise
  `text2_utf8` and `offsets2` for text2; `y` (int64 `[n]`, 0 or 1). The file
  is written atomically (a temporary file renamed).

  Args:
    path: the TSV file.
    out_path: where to write the .npz (a local or gs:// path).
    unescape: see `read_tsv`.
  """
  texts = (bytearray(), bytearray())
  offsets: Tuple[List[int], List[int]] = ([0], [0])
  labels = []
  for label, a, b in _rows(path, unescape):
    labels.append(label)
    for k, text in enumerate((a, b)):
      texts[k].extend(text)
      offsets[k].append(len(texts[k]))
  npz_cache.save_npz(
    out_path,
    compressed=False,
    text_utf8=np.frombuffer(texts[0], np.uint8),
    offsets=np.asarray(offsets[0], np.int64),
    text2_utf8=np.frombuffer(texts[1], np.uint8),
    offsets2=np.asarray(offsets[1], np.int64),
    y=np.asarray(labels, np.int64),
  )
  return out_path


def read_splits(
  folder: str, unescape: bool = False
) -> Dict[str, Tuple[List[bytes], List[bytes], np.ndarray]]:
  """{split: read_tsv(file)} for each of `SPLIT_FILES` present in `folder` (at least one).

  'validation' is LRA's `new_aan_pairs.eval.tsv`. `folder` may be any path epath
  reads (a local folder, gs://...).
  """
  root = epath.Path(folder)
  if not root.is_dir():
    raise ValueError(
      f'config.dataset.data_dir={folder!r}: no such folder; it must hold '
      f'LRA\'s {", ".join(SPLIT_FILES.values())}'
    )
  out = {
    split: read_tsv(str(root / name), unescape)
    for split, name in SPLIT_FILES.items()
    if (root / name).exists()
  }
  if not out:
    raise ValueError(
      f'config.dataset.data_dir={folder!r} holds none of LRA\'s AAN files '
      f'{", ".join(SPLIT_FILES.values())}'
    )
  return out
