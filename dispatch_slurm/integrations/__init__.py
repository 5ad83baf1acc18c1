"""Framework integrations, each an optional extra: they save into the execution's own
folder, publish through ``store.publish``, and resume from the latest publication."""
