"""The environment an untrusted run gets: the parent's, minus anything that looks like a credential.

A variable is removed when its name looks like a key, token, secret, password, DSN or cloud credential,
or when its value gives a credential away (a known token prefix, or user:password inside a URL such as
DATABASE_URL=postgres://user:pw@host or HTTPS_PROXY=http://u:p@proxy). Paths to CA bundles are kept
(a run needs them to reach https), whatever their names say. `pass_env` names are kept regardless.
"""

from __future__ import annotations

import re

SECRET_NAME = re.compile(
    r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASS|PWD|PASSPHRASE|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|SIGNATURE|DSN)"
    r"|_SK$|^SK_"
    r"|^(AWS|AZURE|GCP|GOOGLE|GCLOUD|CLOUDSDK|ANTHROPIC|CLAUDE|OPENAI|GITHUB|GH|GITLAB|HF|HUGGING_?FACE"
    r"|WANDB|COMET|NEPTUNE|DATABRICKS|KAGGLE|DOCKER|NPM|PYPI|TWINE|SSH|GPG|VAULT|SLACK|DISCORD|SENTRY|STRIPE)_",
    re.IGNORECASE,
)
# Names that look secret but hold no secret: shells and tools set them, and runs need them.
NOT_SECRET = re.compile(r"^(PWD|OLDPWD|SSH_TTY|SSH_CONNECTION|SSH_CLIENT|GPG_TTY|XAUTHORITY)$")
# CA bundle paths: kept, whatever their names say (AWS_CA_BUNDLE, CLOUDSDK_..._CA_CERTS_FILE, SSL_CERT_FILE).
CA_BUNDLE = re.compile(r"(CA_BUNDLE|CA_CERTS?(_FILE|_DIR|_PATH)?|SSL_CERT_(FILE|DIR)|CERTS?_(FILE|DIR))$", re.IGNORECASE)
# Credential values that give themselves away whatever the variable is called.
SECRET_VALUE = re.compile(r"^(sk-|sk_live_|sk_test_|rk_live_|ghp_|gho_|ghs_|ghu_|github_pat_|glpat-|xox[abp]-"
                          r"|AKIA[0-9A-Z]{12}|ASIA[0-9A-Z]{12}|hf_[A-Za-z0-9]{20}|AIza[0-9A-Za-z_-]{30})")
URL_CREDENTIALS = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@", re.IGNORECASE)


def looks_secret(name: str, value: str) -> bool:
    value = value or ""
    if CA_BUNDLE.search(name) and "://" not in value:
        return False
    if NOT_SECRET.match(name):
        return bool(URL_CREDENTIALS.search(value))
    return bool(SECRET_NAME.search(name) or SECRET_VALUE.match(value) or URL_CREDENTIALS.search(value))


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
