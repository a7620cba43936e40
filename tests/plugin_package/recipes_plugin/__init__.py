"""Components for the recipes trainer from a package of their own, found through its entry points."""
