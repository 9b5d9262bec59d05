"""Byte-level language modelling on a text corpus: documents cut into windows, cached.

    docs = text_bytes.read_corpus('my_texts/')                 # list of bytes
    paths = text_bytes.write_splits(folder, corpus, seq_len=256, validation_docs=500)
    text_bytes.fingerprint('my_texts/')                        # sha256 of what was read

A corpus (`config.dataset.corpus`) is one of
  * a folder: every text file in it and in its subfolders (hidden ones left out),
    one document each, in the sorted order of their paths inside the folder; a text
    file is one with no NUL byte in its first 8 KiB (git's rule), so images, `.npz`
    and other binary files beside the texts are skipped;
  * a text file (any name but `.npz`): its paragraphs (text between blank lines),
    one document each;
  * an `.npz` with `text_utf8` (uint8, every document's bytes concatenated) and
    `offsets` (integer `[n + 1]`, document i is `text_utf8[offsets[i]:offsets[i+1]]`),
    the layout of the project's IMDB copy; other keys are ignored;
  * `builtin:python_docs` (`BUILTIN`, the config's default): Python's own reference
    documentation as this Python ships it (the `pydoc_data` topics that `help()` shows,
    under the PSF licence; 79 topics, 466 KB in Python 3.11), its paragraphs one
    document each. Nothing to download, and the same text for every run on one Python.
Local paths and URLs (gs://...) are read alike, through `files.gfile`.
Each problem is a one-line ValueError naming the file: a missing path, key or
text file, a wrong dtype or shape, offsets that do not cut the text, a
corpus without a non-empty document or with too few for the held-out set.

`fingerprint` is the sha256 of the corpus's bytes (of a single file: `sha256sum`'s;
of a folder: of `sha256sum`'s lines for its text files, in order): the trainer stores
it with the run's config (`dataset.corpus_sha256`) and refuses to resume the run on
other text.

Documents are split, not windows: a seeded permutation of the non-empty
documents puts the first `validation_docs` in 'validation' and the rest in
'train' (the first `train_docs` of them, 0 = all); a training document whose
bytes equal a held-out one is dropped, so no text is in both splits.

Each document becomes windows of `seq_len` bytes in the sequence-labelling
format (`sequences.py`): the window of bytes d[s:s+L] is scored on every
byte (`labels` = those bytes) and reads the byte before each one (`inputs`
= d[s-1:s+L-1]), the first window of a document reading START (256, the
causal model's start token, `CausalTransformer.start_token`) before its first
byte. So every byte of every document is predicted exactly once, a window's
context is the window itself, and a document's first window is what
`efficient_attn.models.generate` continues from a prompt. Unpacked (`windows`), each
window is a row and the last window of a document is padded (input 0, label -100).
Packed (`packed`, `dataset.packing`), the same windows are packed several to a row
(`packing.py`), with `segment_ids` (0 for the padding left at the rows' ends). The
default corpus's paragraphs leave 48% of 256-byte windows as padding; packed, its
training split is 1,315 rows 99.9% full instead of 2,502 windows. A model that keeps the
documents apart scores every byte in the same context either way. Mean cross-entropy per
scored position / ln 2 is bits per byte.

`write_splits` writes `text_bytes_<key>_{split}.npz` (int16 `inputs` and
`labels`, packed also `segment_ids`, and `settings_json`), `<key>` a hash of the
settings and of the corpus's files (names, sizes and modification times), and keeps a
file whose settings match.
"""

import hashlib
import io
import os
import re
from typing import Dict, List, Sequence, Tuple

import numpy as np

from data import files
from data import npz_cache
from data import packing as packing_lib

VOCAB_SIZE = 256  # byte values; the inputs also hold START
START = VOCAB_SIZE  # the causal model's start token: before a document's first byte
SPLITS = ('train', 'validation')
BUILTIN = 'builtin:python_docs'  # Python's reference documentation (pydoc_data)
_FORMAT = 1  # bump when the written content changes for the same settings
_KINDS = f'a text file, a folder of text files, an .npz (text_utf8, offsets) or {BUILTIN!r}'
_SNIFF = 8192  # bytes read to tell a text file from a binary one (git's rule)
_TEXT: Dict[Tuple[str, int, int], bool] = {}  # (path, size, mtime) -> text file


def _join(folder: str, name: str) -> str:
  return f'{folder.rstrip("/")}/{name}' if files.is_url(folder) else os.path.join(folder, name)


def _read(path: str) -> bytes:
  with files.gfile(path).GFile(path, 'rb') as f:
    return f.read()


def _is_text(path: str, stat) -> bool:
  """No NUL byte in the file's first 8 KiB (remembered per size and modification time)."""
  key = (path, stat.length, stat.mtime_nsec)
  if key not in _TEXT:
    with files.gfile(path).GFile(path, 'rb') as f:
      _TEXT[key] = b'\0' not in f.read(_SNIFF)
  return _TEXT[key]


def _folder_files(folder: str, prefix: str = '') -> List[Tuple[str, object]]:
  """(path inside `folder`, stat) of every file under `folder`, hidden ones left out,
  sorted by that path."""
  gfile = files.gfile(folder)
  out = []
  for entry in gfile.listdir(folder):
    name = entry.rstrip('/')
    if name.startswith('.'):
      continue
    path = _join(folder, name)
    if gfile.isdir(path):
      out += _folder_files(path, f'{prefix}{name}/')
    else:
      out.append((f'{prefix}{name}', gfile.stat(path)))
  return sorted(out, key=lambda x: x[0])


def text_files(corpus: str) -> List[Tuple[str, object]]:
  """(path inside the folder `corpus`, stat) of its text files, in order; ValueError when
  there are none."""
  found = [
    (name, stat) for name, stat in _folder_files(corpus) if _is_text(_join(corpus, name), stat)
  ]
  if not found:
    raise ValueError(f'{corpus}: the folder holds no text file; a text corpus is {_KINDS}')
  return found


def _is_npz(corpus: str) -> bool:
  return corpus.lower().endswith('.npz')


def _check_exists(corpus: str) -> None:
  if not corpus:
    raise ValueError(f"text corpus '' is not valid; it must be {_KINDS}")
  if corpus.startswith('builtin:'):
    if corpus != BUILTIN:
      raise ValueError(f'text corpus {corpus!r} is not valid; valid built-in corpora: {BUILTIN}')
    return
  if not files.gfile(corpus).exists(corpus):
    raise ValueError(f'{corpus} (config.dataset.corpus) does not exist; a text corpus is {_KINDS}')


def python_docs() -> bytes:
  """The text of `BUILTIN`: the `pydoc_data` topics, sorted by name, between blank lines."""
  try:
    from pydoc_data import topics  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ValueError(
      f'{BUILTIN}: this Python has no pydoc_data (its reference '
      f'documentation); set config.dataset.corpus to {_KINDS}'
    ) from None
  return '\n\n'.join(topics.topics[k] for k in sorted(topics.topics)).encode('utf-8')


def paragraphs(text: bytes) -> List[bytes]:
  """The paragraphs of `text` (runs of lines between blank lines), each without its line
  breaks at either end; whitespace-only ones left out."""
  parts = re.split(rb'\r?\n(?:[ \t]*\r?\n)+', text)
  return [p.strip(b'\r\n') for p in parts if p.strip()]


def _text_file(corpus: str) -> bytes:
  raw = _read(corpus)
  if b'\0' in raw[:_SNIFF]:
    raise ValueError(
      f'{corpus}: not a text file (a NUL byte in its first 8 KiB); a text corpus is {_KINDS}'
    )
  return raw


def read_corpus(corpus: str) -> List[bytes]:
  """Every document of `corpus` (see the module docstring), in order."""
  _check_exists(corpus)
  if corpus == BUILTIN:
    return paragraphs(python_docs())
  if files.gfile(corpus).isdir(corpus):
    return [_read(_join(corpus, name)) for name, _ in text_files(corpus)]
  if not _is_npz(corpus):
    return paragraphs(_text_file(corpus))
  try:
    npz = np.load(io.BytesIO(_read(corpus)), allow_pickle=False)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(
      f'{corpus}: not a readable .npz ({type(e).__name__}: {e}); a text corpus is {_KINDS}'
    ) from None
  with npz:
    for key in ('text_utf8', 'offsets'):
      if key not in npz.files:
        raise ValueError(
          f'{corpus} has no {key!r} array; a text corpus .npz needs text_utf8 '
          f'(uint8, the documents concatenated) and offsets (int [n + 1]) '
          f'(it has {", ".join(npz.files) or "no arrays"})'
        )
    text, offsets = np.asarray(npz['text_utf8']), np.asarray(npz['offsets'])
  if text.dtype != np.uint8 or text.ndim != 1:
    raise ValueError(
      f"{corpus}: 'text_utf8' must be uint8 [total bytes], got {text.dtype} "
      f'shape {list(text.shape)}'
    )
  if not np.issubdtype(offsets.dtype, np.integer) or offsets.ndim != 1 or len(offsets) < 1:
    raise ValueError(
      f"{corpus}: 'offsets' must be integers [n + 1], got {offsets.dtype} "
      f'shape {list(offsets.shape)}'
    )
  if offsets[0] != 0 or offsets[-1] != len(text) or (np.diff(offsets) < 0).any():
    raise ValueError(
      f"{corpus}: 'offsets' must rise from 0 to len(text_utf8)={len(text)}, "
      f'got {offsets[0]}..{offsets[-1]}'
      + (' and a decrease' if (np.diff(offsets) < 0).any() else '')
    )
  raw = text.tobytes()
  return [raw[a:b] for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]


def fingerprint(corpus: str) -> str:
  """sha256 (hex) of the corpus's bytes: of the file (as `sha256sum` gives it), of the
  built-in text, or of a folder's `sha256sum` lines ('<sha256>  <path>\\n' for each text
  file, in order)."""
  _check_exists(corpus)
  if corpus == BUILTIN:
    return hashlib.sha256(python_docs()).hexdigest()
  if not files.gfile(corpus).isdir(corpus):
    return hashlib.sha256(_read(corpus) if _is_npz(corpus) else _text_file(corpus)).hexdigest()
  lines = ''.join(
    f'{hashlib.sha256(_read(_join(corpus, name))).hexdigest()}  {name}\n'
    for name, _ in text_files(corpus)
  )
  return hashlib.sha256(lines.encode('utf-8')).hexdigest()


def split_documents(
  docs: Sequence[bytes],
  validation_docs: int,
  train_docs: int = 0,
  seed: int = 0,
  where: str = 'corpus',
) -> Dict[str, List[int]]:
  """{'train': indices, 'validation': indices} of the non-empty `docs` (sorted; see the
  module docstring); ValueError naming `where` when too few documents are left."""
  nonempty = np.asarray([i for i, d in enumerate(docs) if d], np.int64)
  if not len(nonempty):
    raise ValueError(
      f'{where}: the corpus is empty ({len(docs)} documents, none with a '
      f'byte); it needs documents to train and validate on'
    )
  if validation_docs < 1 or len(nonempty) <= validation_docs:
    raise ValueError(
      f'{where}: {len(nonempty)} non-empty documents cannot hold out '
      f'validation_docs={validation_docs} and train on the rest; valid: '
      f'1..{len(nonempty) - 1}'
    )
  order = nonempty[np.random.default_rng(seed).permutation(len(nonempty))]
  validation = np.sort(order[:validation_docs])
  held = {docs[i] for i in validation}
  train = [i for i in order[validation_docs:] if docs[i] not in held]
  if train_docs > 0:
    train = train[:train_docs]
  if not train:
    raise ValueError(
      f'{where}: no training document is left: every document outside the '
      f'{validation_docs} held out repeats one of them'
    )
  return {'train': sorted(int(i) for i in train), 'validation': validation.tolist()}


def pieces(doc: bytes, seq_len: int) -> List[Tuple[np.ndarray, np.ndarray]]:
  """(inputs, labels) int16 `[<= seq_len]` of each window of `doc` (see the module
  docstring): the last one as long as what is left of the document, unpadded."""
  d = np.frombuffer(doc, np.uint8).astype(np.int16)
  x = np.concatenate([np.asarray([START], np.int16), d[:-1]]) if len(d) else d
  return [(x[s : s + seq_len], d[s : s + seq_len]) for s in range(0, len(d), seq_len)]


def windows(docs: Sequence[bytes], seq_len: int) -> Tuple[np.ndarray, np.ndarray]:
  """(inputs, labels) int16 `[windows, seq_len]` of `docs` (see the module docstring):
  each window in a row of its own, padded with input 0 and label -100."""
  parts = [p for doc in docs for p in pieces(doc, seq_len)]
  inputs = np.zeros((len(parts), seq_len), np.int16)
  labels = np.full((len(parts), seq_len), -100, np.int16)
  for row, (x, y) in enumerate(parts):
    inputs[row, : len(x)], labels[row, : len(y)] = x, y
  return inputs, labels


def packed(docs: Sequence[bytes], seq_len: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(inputs, labels, segment_ids) `[rows, seq_len]` of `docs`: the same windows as
  `windows`, packed several to a row (`packing.pack`; segment 0 is padding), so every
  byte is scored in the same context as in `windows`."""
  inputs, labels, segment_ids = packing_lib.pack(
    [p for doc in docs for p in pieces(doc, seq_len)], seq_len
  )
  ids = np.int16 if seq_len <= np.iinfo(np.int16).max else np.int32
  return inputs.astype(np.int16), labels.astype(np.int16), segment_ids.astype(ids)


def _stamp(corpus: str) -> List:
  """What changes when the corpus does: its files' names, sizes and modification times
  (the built-in text: its sha256)."""
  if corpus == BUILTIN:
    return [[BUILTIN, fingerprint(corpus)]]
  gfile = files.gfile(corpus)
  if gfile.isdir(corpus):
    found = text_files(corpus)
  else:
    found = [(os.path.basename(corpus.rstrip('/')), gfile.stat(corpus))]
  return [[name, int(stat.length), int(stat.mtime_nsec)] for name, stat in found]


def settings(
  corpus: str,
  seq_len: int,
  validation_docs: int,
  train_docs: int = 0,
  seed: int = 0,
  packing: bool = False,
) -> Dict:
  """The settings a split file is written from (ValueError if the corpus is missing).
  `packing` is named only when set, so the files of unpacked runs keep their names."""
  _check_exists(corpus)
  where = corpus if corpus == BUILTIN or files.is_url(corpus) else os.path.abspath(corpus)
  return dict(
    format=_FORMAT,
    corpus=where,
    stamp=_stamp(corpus),
    seq_len=int(seq_len),
    validation_docs=int(validation_docs),
    train_docs=int(train_docs),
    seed=int(seed),
    **({'packing': True} if packing else {}),
  )


def split_path(folder: str, split: str, **task) -> str:
  """`folder/text_bytes_<key>_{split}.npz`, `<key>` the `npz_cache.settings_key` of the
  settings (the seed and the documents' counts included), so runs of other settings
  sharing the folder never overwrite each other's files."""
  key = npz_cache.settings_key(settings(**task))
  return os.path.join(folder, f'text_bytes_{key}_{split}.npz')


def check_settings(seq_len: int, validation_docs: int, train_docs: int) -> None:
  """A one-line ValueError naming the first setting the task cannot be built with."""
  if seq_len < 1:
    raise ValueError(f'text_bytes seq_len={seq_len} is not valid; it must be >= 1')
  if validation_docs < 1:
    raise ValueError(
      f'text_bytes validation_docs={validation_docs} is not valid; it must be '
      f'>= 1 (documents held out for validation)'
    )
  if train_docs < 0:
    raise ValueError(
      f'text_bytes train_docs={train_docs} is not valid; it must be >= 0 '
      f'(0 = every document not held out)'
    )


def write_splits(
  folder: str,
  corpus: str,
  seq_len: int,
  validation_docs: int,
  train_docs: int = 0,
  seed: int = 0,
  packing: bool = False,
  verbose: bool = True,
) -> List[str]:
  """Writes the 'train' and 'validation' window files of `corpus` into `folder` (skipping
  files already up to date); returns their paths. `packing`: the windows packed into rows
  (`packed`), with `segment_ids`; else one window a row (`windows`)."""
  check_settings(seq_len, validation_docs, train_docs)
  task = dict(
    corpus=corpus,
    seq_len=seq_len,
    validation_docs=validation_docs,
    train_docs=train_docs,
    seed=seed,
    packing=packing,
  )
  base = settings(**task)
  paths = {s: split_path(folder, s, **task) for s in SPLITS}
  why = {s: npz_cache.problem(paths[s], dict(base, split=s)) for s in SPLITS}
  if not any(why.values()):  # both up to date and whole (their sizes follow from the corpus)
    return [paths[s] for s in SPLITS]
  docs = read_corpus(corpus)
  chosen = split_documents(docs, validation_docs, train_docs, seed, where=corpus)
  npz_cache.makedirs(folder)
  for split in SPLITS:
    docs_of_split = [docs[i] for i in chosen[split]]
    if packing:
      inputs, labels, segment_ids = packed(docs_of_split, seq_len)
      rows = dict(inputs=inputs, labels=labels, segment_ids=segment_ids)
      layout = f'rows of {seq_len}, packed ({100 * packing_lib.fill(segment_ids):.0f}% full)'
    else:
      inputs, labels = windows(docs_of_split, seq_len)
      rows, layout = dict(inputs=inputs, labels=labels), f'windows of {seq_len}'
    npz_cache.save_npz(
      paths[split],
      **rows,
      settings_json=npz_cache.settings_json(dict(base, split=split)),
    )
    npz_cache.report_written(
      paths[split],
      why[split],
      f'{len(chosen[split])} documents, {int((labels >= 0).sum())} bytes in {len(inputs)} {layout}',
      verbose,
    )
  return [paths[s] for s in SPLITS]
