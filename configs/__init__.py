"""Experiment configs: one `get_config()` per file, shared defaults in `common`."""
