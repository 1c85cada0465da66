"""Imports every command module so that each registers itself on the app."""

from ladder._cli import baseline, check, init, run  # noqa: F401
