"""The round loop and everything it does with peers' batches."""
