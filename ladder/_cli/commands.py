"""Imports every command module so that each registers itself on the app."""

from ladder._cli import baseline, check, demo, grade, init, journal, parity, run, supervise  # noqa: F401
