"""Training one run: devices and batch split, strategy, optimiser, the LightningModule, the checks
before a step, resume, callbacks and trackers."""
