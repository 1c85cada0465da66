"""Imports every command module so that each registers itself on the app."""

from ladder._cli import baseline, check, demo, init, journal, run, supervise  # noqa: F401
