"""Sessions committed to images in the API: ``commitSession``, ``sessionImages``, ``deleteSessionImage``."""
