"""Session templates in the API: ``sessionTemplates``, their create/update/delete, and ``createSessionFromTemplate``."""
