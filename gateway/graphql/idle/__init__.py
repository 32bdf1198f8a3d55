"""The idle checks in the API: a session's last idle verdict (``Session.idleChecks``) and, for admins, the
idle policy a session is judged by (``effectiveIdlePolicy``)."""
