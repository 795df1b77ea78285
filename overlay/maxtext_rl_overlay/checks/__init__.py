"""What runs on the target machine: verify, the reports' typed formats, and the
skeleton the verdict commands share (verdict). It imports core/ and probes/
alone: a TPU VM needs nothing of the build."""
