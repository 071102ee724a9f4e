"""The training-side SDK: what a script does inside an attempt (logging, heartbeats, signals, checkpoints).

It never imports the supervisor, the server or the CLI, and never waits on the ledger.
"""
