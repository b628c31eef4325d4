"""Environments the service builds from requirement lines."""
