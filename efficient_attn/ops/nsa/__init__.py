"""Native Sparse Attention (Yuan et al. 2025): its compression, its sparse branches and
their dense reference, as pure functions (`efficient_attn.mechanisms.nsa` declares it).

  compress.py   the block layout of a row (per document) and the compression MLP phi
  sparse.py     the compressed and selected branches in query blocks (never n x n)
  reference.py  every branch as an n x n masked softmax: what sparse.py must equal
"""
