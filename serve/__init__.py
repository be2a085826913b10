"""Serving: the Triton model repository and server, the FastAPI gateway, and load testing."""
