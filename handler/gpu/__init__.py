"""GPU workers: features resident on the device (one copy per GPU, shared by the keeper), padded
ego-graphs and their captured forwards."""
