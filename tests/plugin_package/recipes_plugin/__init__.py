"""Components for the recipes trainer from a package of their own, found through its entry points: a data
format, a zoo model, a recorder, a sparse optimizer and an eviction policy."""
