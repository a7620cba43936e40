"""Click-through-rate prediction, for any recipe to reuse: the batch, the units and the models.

The built-in ``ctr``, ``dlrm`` and ``tabular`` recipes are made of these parts; a user's
click-prediction recipe can be too.
"""
