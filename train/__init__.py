"""The training stage: datasets and augmentation, the loss, the trainer, validation and `bench train`."""
