"""Experiments: a hypothesis against a baseline run, a test run that gates the full run, and a verdict."""
