"""The shipped MovieLens ml-latest-small (GroupLens' licence in its README.txt) and the ``movielens_small`` preset,
which reads it through the ``tabular`` recipe's schema: data a user's own files can replace without code."""
