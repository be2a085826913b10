"""Datasets, augmentation and loading for training and validation."""
