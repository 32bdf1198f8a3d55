"""Recurring schedules of batch sessions: types, queries, mutations."""
