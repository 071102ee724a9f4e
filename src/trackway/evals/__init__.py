"""Evaluations: specs, the evaluator contract, pass@k and seed aggregation, and their place in the ledger."""
