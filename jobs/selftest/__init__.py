"""The detector's self-test: a catalogue of injected resume bugs and the driver that runs it."""
