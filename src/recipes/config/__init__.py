"""Configs: typed configs from layered dicts (``resolution.py``), the standard sections every recipe's config has,
recipes and presets by name, YAML text and overrides. It knows nothing of training."""
