"""Receipts: capture what an attempt ran with: config, data manifest, environment, code and placement."""
