"""Reference baselines: the reference's runs, stored once per version, immutable and verifiable."""
