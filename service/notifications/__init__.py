"""Notifications: channels, the outbox written with each event, and delivery from the scheduler."""
