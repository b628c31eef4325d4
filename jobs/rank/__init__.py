"""What runs inside one rank of a phase: process group, model, checkpoint, probes, workarounds."""
