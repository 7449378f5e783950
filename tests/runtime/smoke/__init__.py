"""The smoke run and the first-minute checks: verdicts, the checkpoint round trip, the memory watch."""
