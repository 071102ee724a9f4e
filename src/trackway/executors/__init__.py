"""Executors: one module per place to run, behind one small interface (submit / poll / cancel / logs)."""
