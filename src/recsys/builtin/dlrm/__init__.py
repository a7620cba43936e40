"""The ``dlrm`` recipe: DLRM on click logs in the Criteo format, real day files or synthetic ones."""
