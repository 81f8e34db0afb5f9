"""Settings: the config schema, the shipped presets, named choices."""
