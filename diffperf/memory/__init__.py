"""Memory per device: model states (weights, gradients, optimizer) and activations."""
