"""' Did you mean ...?' for an unknown config key.

Users bring names from other trainers: a synonym is no misspelling, so difflib misses it
(``learning_rate`` is far from ``lr`` by edit distance, and near ``name``). So the hint tries the
same name spelled another way, a known synonym, a near spelling among the key's siblings, then
the same or a near name anywhere in the config (``lr`` at the top -> ``optimizer.lr``).
"""

from __future__ import annotations

from recipes.errors import closest

# Looked up without case, ``_`` or ``-``.
_SYNONYMS = {
    "lr": "learning_rate lrate",
    "weight_decay": "wd l2 decay",
    "max_num_steps": "num_steps max_steps steps total_steps train_steps num_train_steps",
    "max_num_data_epochs": "epochs num_epochs max_epochs num_train_epochs",
    "batch_size": "batch bs train_batch_size global_batch_size",
    "grad_accumulation": "grad_accum gradient_accumulation gradient_accumulation_steps accumulate_grad_batches",
    "num_warmup_steps": "warmup warmup_steps",
    "max_grad_norm": "clip_grad_norm grad_clip gradient_clipping clip_norm max_norm",
    "tp_size": "tp tensor_parallel_size",
    "mixed_precision": "precision amp",
    "lr_scheduler": "scheduler lr_schedule",
    "dim": "embedding_dim emb_dim",
    "seed": "random_seed",
    "num_buckets": "libsvm_buckets buckets",
}
KEY_ALIASES = {alias.replace("_", ""): key for key, aliases in _SYNONYMS.items() for alias in aliases.split()}


def _normalized(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


def suggest_key(key: str, section: str, siblings: list[str], everywhere: list[str]) -> str:
    """The hint for ``key``, unknown in the section at dotted key ``section`` ('' at the top), whose keys are
    ``siblings``; ``everywhere`` holds every dotted key of the config."""
    prefix = f"{section}." if section else ""
    wanted = _normalized(key)
    target = next((name for name in siblings if _normalized(name) == wanted), None)
    target = target or KEY_ALIASES.get(wanted)
    if target in siblings:
        return f" Did you mean '{prefix}{target}'?"
    names = {wanted, _normalized(target or wanted)}
    named = [k for k in everywhere if _normalized(k.rsplit(".", 1)[-1]) in names]
    if named:
        return " Did you mean " + " or ".join(f"'{k}'" for k in named[:2]) + "?"
    return closest(f"{prefix}{key}", [f"{prefix}{name}" for name in siblings]) or closest(f"{prefix}{key}", everywhere)
