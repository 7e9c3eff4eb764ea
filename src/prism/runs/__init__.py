"""A run on disk: where its files live, its identity and hash, checkpoint files and the run lock."""
