"""The ``movielens`` recipe: click-through prediction (rating >= 4) on the shipped MovieLens ml-latest-small."""
