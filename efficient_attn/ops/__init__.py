"""The pure math of the mechanisms, on `[batch, length, heads, head_dim]` arrays: no Flax."""
