"""The supervisor: a LangGraph state machine that drives an agent through the protocol.

The journal is the source of truth; the graph's checkpointed state is only a cursor. Every node
first asks the journal what is already recorded for its attempt, so a node re-executed after a
crash, a SIGKILL or an `interrupt()` resume never starts a recorded run again.
"""
