"""Internal (stage-to-stage) APIs; not a public promise."""
