"""Remote runners: the same run contract as a local run, kept on another machine (`ssh`) or on a cluster
SkyPilot launches (`skypilot`).

`agent` is the remote end: a standard-library program shipped to the machine with the few ladder modules
it reuses there (`bundle` names them), which builds the environment, starts the run detached and reports
on it. `ssh` is the transport (the system OpenSSH client), `session` drives one run through the agent and
streams it back, `execute` writes the local run directory as a local run would, `skypilot` adapts the
same to SkyPilot's SDK, `targets` validates the profile's choice of runner.

Importing this package must stay free of third-party imports: `agent` runs under a bare python3 there.
"""
