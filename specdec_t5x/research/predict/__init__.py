"""Predictions at the paper's sizes: compiled costs, the paper's table, device tables, the ceiling."""
