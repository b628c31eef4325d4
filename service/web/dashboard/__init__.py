"""The HTML dashboard: parity matrix, run list, run and triage pages, config history, logs."""
