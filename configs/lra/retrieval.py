"""Long Range Arena Retrieval (Tay et al. 2021): does one paper of a pair cite the other?

A dual encoder (`efficient_attn.models.TextMatcher`): both byte-level
documents go through one shared encoder, the two pooled features are joined
and an MLP classifies the pair. The data are LRA's released TSV files, which
cannot be generated: point `data_dir` at the folder that holds
`new_aan_pairs.{train,eval,test}.tsv` (lra_release/lra_release/tsv_data/).
The argument picks the mechanism, projection, folder and size:

  base: LRA's setting (lra_benchmarks/matching/configs/base_match_config.py):
    documents of 4,000 bytes; 4 layers, width 128, 4 heads, MLP 512, fixed
    sinusoidal positions, mean pooling (LRA: CLS, but one more token makes the length one that block
    mechanisms cannot tile), features joined as [e1, e2] (the default of LRA's code;
    its paper, appendix A.1.3, writes [e1, e2, e1 * e2, e1 - e2]: model.interaction='nli');
    batch 32, 5,000 steps. LRA's optimiser is Adam at 0.05 with 8,000 warm-up
    steps and rsqrt decay, weight decay 0.1; here AdamW peaks at 0.05 /
    sqrt(8000) = 5.6e-4 after 1,000 warm-up steps and decays by cosine.
  small: documents of 1,000 bytes; 2 layers, width 64, 4 heads, MLP 128; 2,000 steps.

    --config=configs/lra/retrieval.py:mechanism=linear,data_dir=/data/lra_release/tsv_data
"""

from configs import common
from configs import presets

SIZES = {
  'base': dict(
    model=dict(d_model=128, depth=4, num_heads=4, mlp_dim=512), max_length=4000, num_steps=5000
  ),
  'small': dict(
    model=dict(d_model=64, depth=2, num_heads=4, mlp_dim=128), max_length=1000, num_steps=2000
  ),
}


def get_config(arg=None):
  args = common.parse_arg(arg, mechanism='softmax', projection='standard', data_dir='', size='base')
  size = common.size_preset('configs/lra/retrieval.py', SIZES, args['size'])
  config = presets.aan(common.base(), data_dir=args['data_dir'], max_length=size['max_length'])
  common.lra_model(config, args['mechanism'], args['projection'], pool='mean', **size['model'])
  config.model.interaction = 'concat'
  common.fit_blocks(config, config.dataset.max_length)
  config.dataset.batch_size = 32
  config.dataset.eval_batch_size = 256
  config.optim.update(dict(learning_rate=0.05 / 8000**0.5, warmup_steps=1000, weight_decay=0.1))
  config.train.update(
    dict(num_steps=size['num_steps'], log_every=100, eval_every=1000, checkpoint_every=1000)
  )
  return config
