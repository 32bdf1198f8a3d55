"""Operators' resource settings in the API: resource presets, user and project resource policies, and the resource
groups with their agents' capacity and occupancy."""
