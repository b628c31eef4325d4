"""How phases are launched: submitit executors driving the rank entry point."""
