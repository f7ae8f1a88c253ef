"""Sizes and memory budgets: they live on the ground floor (generator/sizes.py), below the board
file that reads them too; the compile stage's modules import them from here as before."""

from ..sizes import AUTO_MARGIN_BYTES, AutoBudget, format_size, parse_budget, parse_size

__all__ = ["AUTO_MARGIN_BYTES", "AutoBudget", "format_size", "parse_budget", "parse_size"]
