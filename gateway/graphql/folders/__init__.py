"""Storage folders in the API: ``folders``, ``folder``, ``folderUsage`` and their mutations."""
