"""The measurement every backend goes through: fp32 oracle, byte model, timers, ranking."""
