"""The Flax layers around the mechanisms: Linen and NNX modules, projections, decoding,
hybrids, the sequence split."""
