"""The commands of ``python -m recipes``: list, show, train, eval, predict, importance, export-tables, export.

The top room of the framework: each command resolves a job (``job.py``: config, gangs, the recipe's parts) and hands
it to the rooms below; nothing below imports a command.
"""
