"""The LoRA study's results table, from lora_mnist.json (`python -m studies.tables`)."""

from studies import tables

JSON = 'studies/lora_mnist/lora_mnist.json'
QUESTION = (
  'Does LoRA recover accuracy on transformed MNIST, as the "Efficient Attention" report says?'
)
BUDGET = '5 epochs'
VARIANTS = ('quantised', 'rotated', 'inverted')
# The report's test accuracies (%), transcribed from its tables: base and full fine-tuning
# per variant, then LoRA per rank, fine-tuned from the base and from scratch.
PUBLISHED = {
  'base': dict(plain=93.2, quantised=85.58, rotated=12.38, inverted=5.52),
  'full_finetune': dict(quantised=93.57, rotated=91.97, inverted=76.41),
  'finetune': {
    1: (91.20, 37.53, 16.23),
    2: (91.30, 49.01, 17.92),
    4: (91.42, 69.10, 16.32),
    8: (91.39, 77.49, 32.19),
    16: (91.72, 86.95, 62.26),
    32: (92.31, 89.50, 68.06),
    64: (93.19, 90.41, 71.88),
  },
  'scratch': {
    1: (23.50, 25.91, 22.21),
    2: (37.48, 43.96, 45.81),
    4: (64.87, 62.60, 69.67),
    8: (77.96, 82.39, 83.11),
    16: (88.20, 86.76, 87.38),
    32: (90.13, 90.62, 90.25),
    64: (91.66, 91.85, 86.01),
  },
}


def _cell(mean: float, spread: float, published: float) -> str:
  return f'{100 * mean:.2f} ± {100 * spread:.2f}% ({published:.2f}%)'


def table() -> str:
  d = tables.load(JSON)
  spread = d['spread']
  rows = [
    ['base, not adapted', 0]
    + [_cell(d['base'][v], spread['base'][v], PUBLISHED['base'][v]) for v in VARIANTS]
  ]
  rows.append(
    ['full fine-tuning', f"{d['params']['full']:,}"]
    + [
      _cell(d['full_finetune'][v], spread['full_finetune'][v], PUBLISHED['full_finetune'][v])
      for v in VARIANTS
    ]
  )
  for kind, name in (('finetune', 'LoRA on the base'), ('scratch', 'LoRA alone')):
    for r in d['ranks']:
      rows.append(
        [f'{name}, r = {r}', f"{d['params'][f'r{r}']:,}"]
        + [
          _cell(d[kind][str(r)][v], spread[kind][str(r)][v], PUBLISHED[kind][r][i])
          for i, v in enumerate(VARIANTS)
        ]
      )
  note = (
    f"Validation accuracy, mean ± half the range of seeds {', '.join(map(str, d['seeds']))};"
    f" the report's test accuracy in brackets. Unadapted base on plain images: "
    f"{_cell(d['base']['plain'], spread['base']['plain'], PUBLISHED['base']['plain'])}. "
    f"{d['steps']['adaptation']:,} steps of batch 128 per run."
  )
  return tables.md_table(['run', 'trainable params'] + list(VARIANTS), rows) + '\n\n' + note


def headline() -> str:
  d = tables.load(JSON)
  return (
    f"rotated: {tables.pct(d['finetune']['1']['rotated'])} (r = 1) to "
    f"{tables.pct(d['finetune']['64']['rotated'])} (r = 64); full fine-tuning "
    f"{tables.pct(d['full_finetune']['rotated'])}"
  )
