"""Protocol definitions (*.toml) and agent prompts (prompts/*.md): data, shipped as `ladder.protocols`."""
