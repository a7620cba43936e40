"""Training: the Trainer and its step loop, validation and early stopping, online windows, data and tensor
parallelism, what a recipe hands the framework (``parts.py``, ``protocols.py``) and the checks of each step."""
