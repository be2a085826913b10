"""Subcommands of the serving side (filled in by the serving issue)."""


def register(sub) -> None:
    pass
