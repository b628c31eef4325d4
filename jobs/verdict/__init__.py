"""The pure verdict: compare two phase documents, name the evidence and the signatures (no torch)."""
