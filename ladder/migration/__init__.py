"""A migration: its spec (`ladder.toml`, what to run and how to read it), the protocol whose thresholds
judge it, and its workspace (where baselines, journals and runs live, and who may write there)."""
