"""Runs: one captured execution of the experiment on a profile, and everything it leaves behind.

`execute` runs a command through a runner (`runner/`) in the profile's environment (`envs`) with the
probe injected, `parse` reads its output as it streams, `probe_report` merges the probe's per-process
reports, and `records` is the versioned run.json. Nothing here judges a run: that is `ladder.checks`.
"""
