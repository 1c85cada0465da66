"""The environment an untrusted run gets: the parent's, minus anything that looks like a credential."""

from __future__ import annotations

import re

# Names that look like keys, tokens, secrets or cloud credentials. Matched case-insensitively
# against the whole variable name.
SECRET_NAME = re.compile(
    r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|SIGNATURE)"
    r"|^(AWS|AZURE|GCP|GOOGLE|GCLOUD|CLOUDSDK|ANTHROPIC|CLAUDE|OPENAI|GITHUB|GH|GITLAB|HF|HUGGING_?FACE"
    r"|WANDB|COMET|NEPTUNE|DATABRICKS|KAGGLE|DOCKER|NPM|PYPI|TWINE|SSH|GPG|VAULT|SLACK|DISCORD)_",
    re.IGNORECASE,
)
# Credential values that give themselves away whatever the variable is called.
SECRET_VALUE = re.compile(r"^(sk-|ghp_|gho_|ghs_|github_pat_|xox[abp]-|AKIA[0-9A-Z]{12}|hf_[A-Za-z0-9]{20})")


def looks_secret(name: str, value: str) -> bool:
    return bool(SECRET_NAME.search(name) or SECRET_VALUE.match(value or ""))


def scrubbed_env(parent: dict[str, str], pass_env: list[str] | None = None) -> tuple[dict[str, str], list[str]]:
    """Return (environment for the run, names removed). `pass_env` names are kept regardless."""
    allowed = set(pass_env or ())
    env, removed = {}, []
    for name, value in parent.items():
        if name in allowed or not looks_secret(name, value):
            env[name] = value
        else:
            removed.append(name)
    return env, sorted(removed)
