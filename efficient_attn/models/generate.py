"""Generation from a causal model: the prompt prefilled, then decoding steps until each row ends.

    out = generate(model, params, prompt, 128, temperature=0.8, top_p=0.95, eos_id=eos,
                   rng=jax.random.key(0))
    out.tokens[r, : out.lengths[r]]    # row r's new tokens (its end token included)
    model.generate(params, prompt, 128, ...)   # the same, from a CausalTransformer

`prompt` `[batch, P]` int holds the model's input tokens (a `CausalTransformer` document
begins with `model.start_token`). The prompt fills each layer's decode state (`prefill`),
then a `lax.while_loop` runs one decoding step per position
(`efficient_attn.layers.decoding`: a key/value cache, a window's ring buffer or a
recurrent state) and samples each next token with `sampling.sample_logits`
(temperature, top-k, top-p). A row stops after `eos_id` or `max_new_tokens` new tokens,
and the loop stops when every row has.

**Prompts of different lengths** share a batch **right-padded**, with `prompt_lengths`
`[batch]`: the shortest prompt's length m is prefilled for every row in one pass, and
the longer prompts' remaining tokens are fed through the decoding steps as given (teacher
forcing), each row sampling from its own last prompt token on. Why right and not left:
every row's tokens then sit at the positions they would have alone (0, 1, 2, ...), so no
padding enters a cache, a recurrent state or a short convolution's window, positions
need no per-row offset, and every mechanism with a decoding form gives each row exactly
what it gives that row alone, whether or not it keeps packed documents apart. The cost
is that the longest prompt's extra tokens take one step each instead of one pass.

Prefill equals the parallel forward pass: the tokens a greedy generation
(temperature 0) returns are the argmax of the parallel forward pass over the prompt and
them (`tests/models/test_generate.py`, every decoding form). A mechanism without a
decoding form is refused in one line.
"""

import functools
from typing import Any, Callable, NamedTuple, Optional

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from efficient_attn.layers import decoding
from efficient_attn.layers import hybrid
from efficient_attn.models import sampling


class Generated(NamedTuple):
  """What `generate` returns.

  Attributes:
    tokens: int32 `[batch, max_new_tokens]`: row r's new tokens are `tokens[r, :lengths[r]]`
      (its end token the last, when one ended it); the rest hold `eos_id` (0 without one).
    lengths: int32 `[batch]`, the new tokens of each row.
  """

  tokens: jnp.ndarray
  lengths: jnp.ndarray


def check_decodes(model) -> None:
  """A one-line ValueError when a mechanism of `model` (a `config.mechanism`, a name or a
  pattern) has no decoding form."""
  mechanism = getattr(getattr(model, 'config', None), 'mechanism', None)
  if mechanism is None:
    return
  for decl in hybrid.declarations(mechanism):
    if not decl.decode:
      raise ValueError(
        f'generate: mechanism {decl.name!r} has no decoding form; mechanisms that can '
        f'decode: {", ".join(decoding.decodable_mechanisms())}'
      )


def prefill(decoder, params, cache, tokens: jnp.ndarray):
  """(cache, logits `[batch, vocab]` at the last token) after feeding `tokens` `[batch, m]`,
  m >= 1, to `decoder` (the model with decode=True) from `cache`.

  One decoding call of m tokens: each layer runs them in one parallel pass and leaves
  the decode state the m single-token steps would (`efficient_attn.layers.cache`).
  """
  logits, variables = decoder.apply({'params': params, 'cache': cache}, tokens, mutable=['cache'])
  return variables['cache'], logits[:, -1]


def make_generate(model, max_new_tokens: int, *, prefill_length: int, top_k: int = 0) -> Callable:
  """The jit-compiled generation loop: `run(params, prompt, prompt_lengths, temperature,
  top_p, eos_id, rng) -> Generated`, for prompts `[batch, P]` whose shortest is
  `prefill_length` tokens (see `generate`; eos_id -1: none). The shapes, `max_new_tokens`,
  `prefill_length` and `top_k` are compiled in; the rest may change between calls."""
  decoder = model.clone(decode=True)
  step = sampling.make_step(decoder)
  m, n = prefill_length, max_new_tokens

  @jax.jit
  def run(params, prompt, prompt_lengths, temperature, top_p, eos_id, rng):
    batch, length = prompt.shape
    rows = jnp.arange(batch)
    cache = sampling.init_cache(decoder, params, batch, length + n - 1)
    cache, logits = prefill(decoder, params, cache, prompt[:, :m])

    def choose(logits, t, out, count, done):
      """The token at position t of each row: the prompt's, else sampled; recorded."""
      sampled = sampling.sample_logits(
        jax.random.fold_in(rng, t), logits, temperature, top_k=top_k, top_p=top_p
      )
      given = lax.dynamic_index_in_dim(prompt, jnp.minimum(t, length - 1), 1, keepdims=False)
      in_prompt = t < prompt_lengths
      token = jnp.where(in_prompt, given, sampled)
      new = ~in_prompt & ~done
      at = jnp.minimum(count, n - 1)
      out = out.at[rows, at].set(jnp.where(new, token, out[rows, at]))
      count = count + new
      done = done | (new & ((token == eos_id) | (count >= n)))
      return token, out, count, done

    out = jnp.full((batch, n), jnp.maximum(eos_id, 0), jnp.int32)
    count = jnp.zeros((batch,), jnp.int32)
    token, out, count, done = choose(logits, m, out, count, jnp.zeros((batch,), bool))

    def body(carry):
      cache, token, t, out, count, done = carry
      logits, cache = step(params, cache, token)
      token, out, count, done = choose(logits, t + 1, out, count, done)
      return cache, token, t + 1, out, count, done

    carry = (cache, token, jnp.int32(m), out, count, done)
    _, _, _, out, count, _ = lax.while_loop(lambda c: ~jnp.all(c[-1]), body, carry)
    return Generated(out, count)

  return run


@functools.lru_cache(maxsize=16)
def _compiled(model, max_new_tokens: int, prefill_length: int, top_k: int) -> Callable:
  return make_generate(model, max_new_tokens, prefill_length=prefill_length, top_k=top_k)


def _loop(model, max_new_tokens: int, prefill_length: int, top_k: int) -> Callable:
  """`make_generate`'s loop, kept for the next call where the model is hashable."""
  try:
    return _compiled(model, max_new_tokens, prefill_length, top_k)
  except TypeError:  # unhashable (a config holding a dict): compiled for this call
    return make_generate(model, max_new_tokens, prefill_length=prefill_length, top_k=top_k)


def generate(
  model,
  params,
  prompt,
  max_new_tokens: int,
  *,
  prompt_lengths=None,
  temperature: float = 1.0,
  top_k: int = 0,
  top_p: float = 1.0,
  eos_id: Optional[int] = None,
  rng: Optional[Any] = None,
) -> Generated:
  """Continues each prompt by up to `max_new_tokens` tokens (see the module docstring).

  Args:
    model: a causal model with a decoding form (`CausalTransformer`; any module with
      `decode` and a 'cache' collection), built with a `max_length` of at least
      P + max_new_tokens - 1.
    params: its parameters (the 'params' collection).
    prompt: int `[batch, P]`, right-padded when the prompts differ in length.
    max_new_tokens: at most this many new tokens per row (>= 1).
    prompt_lengths: int `[batch]` in 1..P, concrete (a numpy array or a list): each row's
      prompt length; None: every row is P long.
    temperature: 0 (or below) takes the argmax; else sampled from softmax(logits / t).
    top_k: sample among the k most likely tokens only (0: all).
    top_p: sample among the fewest most likely tokens whose probabilities reach top_p
      (1: all).
    eos_id: a row ends with this token (None: rows end at max_new_tokens).
    rng: a PRNG key; needed when temperature > 0.

  Returns:
    `Generated(tokens [batch, max_new_tokens], lengths [batch])`.
  """
  check_decodes(model)
  prompt = jnp.asarray(prompt, jnp.int32)
  if prompt.ndim != 2 or prompt.shape[1] < 1:
    raise ValueError(f'generate: prompt of shape {tuple(prompt.shape)}; valid: [batch, P >= 1]')
  batch, length = prompt.shape
  if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
    raise ValueError(f'generate: max_new_tokens={max_new_tokens!r} is not valid; it must be >= 1')
  lengths = np.full(batch, length) if prompt_lengths is None else np.asarray(prompt_lengths)
  if lengths.shape != (batch,) or lengths.min() < 1 or lengths.max() > length:
    raise ValueError(
      f'generate: prompt_lengths {lengths.tolist()} do not fit the prompt {[batch, length]}; '
      f'valid: [batch] lengths in 1..{length}'
    )
  max_length = getattr(model, 'max_length', None)
  if max_length is not None and length + max_new_tokens - 1 > max_length:
    raise ValueError(
      f'generate: a prompt of {length} tokens and max_new_tokens={max_new_tokens} take '
      f'{length + max_new_tokens - 1} positions; the model has max_length={max_length}'
    )
  if rng is None:
    if not temperature <= 0:
      raise ValueError(
        f'generate: temperature={temperature} samples and needs an rng (a PRNG key); pass '
        f'rng=jax.random.key(0), or temperature=0 for the argmax'
      )
    rng = jax.random.key(0)  # unused: every token is the argmax
  if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
    raise ValueError(f'generate: top_k={top_k!r} is not valid; valid: an int >= 0 (0: no cut)')
  if not 0.0 < top_p <= 1.0:
    raise ValueError(f'generate: top_p={top_p!r} is not valid; it must be in (0, 1] (1: no cut)')
  run = _loop(model, max_new_tokens, int(lengths.min()), top_k)
  return run(
    params,
    prompt,
    jnp.asarray(lengths, jnp.int32),
    jnp.float32(temperature),
    jnp.float32(top_p),
    jnp.int32(-1 if eos_id is None else eos_id),
    rng,
  )
