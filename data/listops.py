"""Long ListOps (Tay et al., 2021), generated offline with numpy.

Follows the generator of the Long Range Arena (LRA) repository
(`lra_benchmarks/data/listops.py`), itself a longer version of ListOps (Nangia &
Bowman, 2018):

  * A node at depth d < max_depth (the root has depth 1) is an operator with
    probability 0.25 (LRA's `VALUE_P`: it draws r ~ U[0, 1) and makes a digit
    when r > 0.25), else a digit; at depth max_depth it is always a digit. So
    a node is a digit with probability 0.75, not 0.25.
  * An operator takes U{2..max_args} arguments and is one of MIN, MAX, MED
    (median; for an even count the mean of the two middle values rounded down,
    which is LRA's `int(np.median(...))`) and SM (sum mod 10), uniformly.
    Digits are U{0..9}.
  * An expression is kept when min_length < length < max_length (strict, as
    LRA's `length > min_length and length < max_length`), where length counts
    operator, digit and ']' tokens. Everything else is rejected and redrawn.
  * Expressions are unique: LRA draws into a `set`, and
    `listops_files.write_splits` keeps the splits disjoint as well.

Token stream. LRA's TSV files hold `to_string(tree)`, which wraps every
binary node of its tree in parentheses, e.g. `( ( ( [MAX 2 ) 9 ) ] )`; its
input pipeline then deletes '(' and ')', renames ']' to 'X' and splits on
whitespace, so its models see `[MAX 2 9 X`. The ids here are that stream,
without parentheses, with ']' for 'X'. LRA's ids come from a
`TokenTextEncoder` built over a set, so their order (and one extra OOV id)
differ; the vocabulary size here is 16 with 0 for padding.

Differences from LRA: the random stream is a numpy Generator (LRA uses
Python's `random` module, so the same data cannot be reproduced); a draw is
abandoned as soon as it is known to reach max_length, which saves time but
leaves the distribution of kept expressions unchanged; and the splits are
drawn with separate seeds instead of slicing one set.
"""

import hashlib
import itertools
import time
import types
from typing import Iterable, List, NamedTuple, Optional, Sequence, Set, Tuple, Union

import numpy as np

PAD = '<pad>'
MIN = '[MIN'
MAX = '[MAX'
MED = '[MED'
SUM_MOD = '[SM'
END = ']'
OPERATORS = (MIN, MAX, MED, SUM_MOD)
VOCAB = (PAD,) + tuple(str(d) for d in range(10)) + OPERATORS + (END,)
VOCAB_SIZE = len(VOCAB)  # 16
TOKEN_IDS = types.MappingProxyType({token: i for i, token in enumerate(VOCAB)})
PAD_ID = 0
DIGIT_OFFSET = 1  # id of digit d is d + 1
OPERATOR_IDS = tuple(TOKEN_IDS[op] for op in OPERATORS)  # 11..14
END_ID = TOKEN_IDS[END]  # 15
NUM_CLASSES = 10

OPERATOR_PROBABILITY = 0.25  # LRA's VALUE_P: a node below max_depth is an operator w.p. 0.25
_BLOCK = 8192  # uniforms drawn from the Generator at a time
_MAX_DRAWS_PER_EXAMPLE = 1_000_000  # safety net against settings that (almost) never accept

Tree = Union[int, Tuple[str, Sequence['Tree']]]  # a digit, or (operator, arguments)


class Examples(NamedTuple):
  """Generated expressions.

  tokens: int16 `[n, max_length]`, ids of `VOCAB`, left-aligned, 0 = padding.
  labels: int64 `[n]`, the value of each expression, 0..9.
  lengths: int64 `[n]`, the number of tokens of each expression.
  """

  tokens: np.ndarray
  labels: np.ndarray
  lengths: np.ndarray


def apply_operator(op: str, args: Sequence[int]) -> int:
  """The value of `op` (one of `OPERATORS`) applied to digits `args`."""
  if not args:
    raise ValueError(f'operator {op} needs at least one argument')
  if op == MIN:
    return min(args)
  if op == MAX:
    return max(args)
  if op == SUM_MOD:
    return sum(args) % 10
  if op == MED:
    s = sorted(args)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2
  raise ValueError(f'op must be one of {OPERATORS}, got {op!r}')


def encode(expression: Union[str, Sequence[str]]) -> np.ndarray:
  """'[MAX 2 9 ]' (LRA's '( ... )' and 'X' for ']' also accepted) -> int16 ids `[length]`."""
  words = expression.split() if isinstance(expression, str) else list(expression)
  ids = []
  for word in words:
    if word in ('(', ')'):
      continue
    word = END if word == 'X' else word
    if word not in TOKEN_IDS or word == PAD:
      raise ValueError(f'token must be one of {VOCAB[1:]}, got {word!r}')
    ids.append(TOKEN_IDS[word])
  return np.asarray(ids, np.int16)


def decode(ids: Iterable[int]) -> str:
  """Token ids (padding dropped) -> '[MAX 2 9 ]'."""
  return ' '.join(VOCAB[int(i)] for i in ids if int(i) != PAD_ID)


def _evaluate_ids(ids: Sequence[int]) -> int:
  """Stack evaluation of a prefix token stream of ids (no padding)."""
  if not ids:
    raise ValueError('empty expression')
  frames: List[Tuple[str, List[int]]] = []
  result = None
  for position, i in enumerate(ids):
    if result is not None:
      raise ValueError(f'tokens after the end of the expression at position {position}')
    if DIGIT_OFFSET <= i < DIGIT_OFFSET + 10:
      value = i - DIGIT_OFFSET
    elif i in OPERATOR_IDS:
      frames.append((VOCAB[i], []))
      continue
    elif i == END_ID:
      if not frames:
        raise ValueError(f"unmatched ']' at position {position}")
      op, args = frames.pop()
      value = apply_operator(op, args)
    else:
      raise ValueError(f'token id must be in 1..{VOCAB_SIZE - 1}, got {i} at position {position}')
    if frames:
      frames[-1][1].append(value)
    else:
      result = value
  if frames:
    raise ValueError(f'{len(frames)} operator(s) not closed')
  return result


def evaluate(tree_or_tokens: Union[Tree, str, Sequence[str], Sequence[int], np.ndarray]) -> int:
  """The value (0..9) of an expression.

  Args:
    tree_or_tokens: a tree (a digit int, or `(operator, [arguments])` with an
      operator of `OPERATORS`), an expression string such as '[MAX 2 [MIN 4 7 ]
      ]' (LRA's parentheses and 'X' accepted), a sequence of such token
      strings, or an integer array/sequence of token ids (zeros, padding,
      are dropped).

  Returns:
    int, 0..9.
  """
  x = tree_or_tokens
  if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
    if not 0 <= x <= 9:
      raise ValueError(f'a digit must be in 0..9, got {x}')
    return int(x)
  if isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) and x[0] in OPERATORS:
    return apply_operator(x[0], [evaluate(arg) for arg in x[1]])
  if isinstance(x, str) or (len(x) and isinstance(x[0], str)):
    return _evaluate_ids(encode(x).tolist())
  ids = np.asarray(x)
  if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(f'tokens must be a 1-D integer array, got shape {ids.shape} {ids.dtype}')
  return _evaluate_ids(ids[ids != PAD_ID].tolist())


def _uniforms(rng: np.random.Generator) -> Iterable[float]:
  """An endless stream of U[0, 1) floats from `rng`, drawn in blocks (fast `next`)."""
  return itertools.chain.from_iterable(iter(lambda: rng.random(_BLOCK).tolist(), None))


def _draw(draws, max_depth: int, max_args: int, max_length: int) -> Optional[List[int]]:
  """One expression (prefix ids), or None once it is bound to reach `max_length`."""
  uniform = draws.__next__
  num_ops = len(OPERATOR_IDS)
  tokens: List[int] = []
  push = tokens.append
  remaining: List[int] = []  # arguments still to draw, per open operator
  open_ops = 0  # len(remaining); the next node has depth open_ops + 1
  while True:
    if open_ops + 1 < max_depth and uniform() <= OPERATOR_PROBABILITY:
      remaining.append(2 + int(uniform() * (max_args - 1)))
      push(OPERATOR_IDS[int(uniform() * num_ops)])
      open_ops += 1
    else:
      push(DIGIT_OFFSET + int(uniform() * 10))
      while open_ops:  # a finished argument may finish its operator, and so on up
        remaining[-1] -= 1
        if remaining[-1]:
          break
        remaining.pop()
        push(END_ID)
        open_ops -= 1
      if not open_ops:
        return tokens
    if len(tokens) + open_ops >= max_length:  # each open operator still needs a ']'
      return None


def _max_tree_length(max_depth: int, max_args: int) -> int:
  length = 1
  for _ in range(max_depth - 1):
    length = 2 + max_args * length
  return length


def fingerprint(ids: np.ndarray) -> bytes:
  """A 16-byte digest of one expression's ids (padding dropped), for uniqueness checks."""
  ids = np.asarray(ids)
  return hashlib.blake2b(ids[ids != PAD_ID].astype(np.uint8).tobytes(), digest_size=16).digest()


def _check_settings(num_examples, min_length, max_length, max_depth, max_args):
  if num_examples < 0:
    raise ValueError(f'num_examples must be >= 0, got {num_examples}')
  if max_depth < 1:
    raise ValueError(f'max_depth must be >= 1, got {max_depth}')
  if max_args < 2:
    raise ValueError(f'max_args must be >= 2, got {max_args}')
  if min_length < 0 or max_length - min_length < 2:
    raise ValueError(
      f'need 0 <= min_length <= max_length - 2 (lengths are strictly between), '
      f'got min_length={min_length}, max_length={max_length}'
    )
  if _max_tree_length(max_depth, max_args) <= min_length:
    raise ValueError(
      f'min_length={min_length} is unreachable with max_depth={max_depth}, '
      f'max_args={max_args} (longest: {_max_tree_length(max_depth, max_args)})'
    )


def generate(
  num_examples: int,
  seed: Union[int, Sequence[int]],
  min_length: int = 500,
  max_length: int = 2000,
  max_depth: int = 10,
  max_args: int = 10,
  exclude: Optional[Set[bytes]] = None,
  progress: Optional[str] = None,
) -> Examples:
  """Draws `num_examples` distinct expressions with min_length < length < max_length.

  Args:
    num_examples: how many expressions.
    seed: seed of a `np.random.default_rng` (an int or a sequence of ints).
    min_length: lengths must exceed this (LRA: 500).
    max_length: lengths must be below this (LRA: 2000); also the width of `tokens`.
    max_depth: depth at which nodes are forced to be digits (root = 1; LRA: 10).
    max_args: most arguments per operator (LRA: 10).
    exclude: fingerprints (see `fingerprint`) of expressions not to draw, e.g.
      those of other splits; not modified.
    progress: a name; if given, prints progress with rate and ETA.

  Returns:
    `Examples(tokens int16 [n, max_length], labels int64 [n], lengths int64 [n])`.
  """
  _check_settings(num_examples, min_length, max_length, max_depth, max_args)
  draws = _uniforms(np.random.default_rng(seed))
  tokens = np.zeros((num_examples, max_length), np.int16)
  labels = np.zeros(num_examples, np.int64)
  lengths = np.zeros(num_examples, np.int64)
  seen: Set[bytes] = set()
  exclude = exclude or set()
  start = last_print = time.monotonic()
  count, misses = 0, 0
  while count < num_examples:
    misses += 1
    if misses > _MAX_DRAWS_PER_EXAMPLE:
      raise RuntimeError(
        f'no new expression in {_MAX_DRAWS_PER_EXAMPLE} draws; '
        'widen the length range or ask for fewer examples'
      )
    ids = _draw(draws, max_depth, max_args, max_length)
    if ids is None or not min_length < len(ids) < max_length:
      continue
    row = np.asarray(ids, np.int16)
    key = fingerprint(row)
    if key in seen or key in exclude:  # LRA's expressions are unique too (a set)
      continue
    seen.add(key)
    misses = 0
    tokens[count, : len(ids)] = row
    labels[count] = _evaluate_ids(ids)
    lengths[count] = len(ids)
    count += 1
    now = time.monotonic()
    if progress and (now - last_print > 10 or count == num_examples):
      last_print = now
      _print_progress(progress, count, num_examples, now - start)
  return Examples(tokens, labels, lengths)


def _print_progress(name: str, done: int, total: int, elapsed: float):
  rate = done / max(elapsed, 1e-9)
  eta = (total - done) / max(rate, 1e-9)
  print(
    f'{name}: {done}/{total} examples, {rate:.0f} examples/s, '
    f'elapsed {elapsed:.0f} s, ETA {eta:.0f} s',
    flush=True,
  )
