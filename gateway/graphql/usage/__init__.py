"""Usage accounting over GraphQL: ``usage``."""
