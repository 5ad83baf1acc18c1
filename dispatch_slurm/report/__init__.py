"""`dispatch-slurm report ROOT`: what happened to a job, read from its root alone
(build.py: the data and its definitions; render.py: as text; timeline.py: as a picture)."""

from . import render, timeline
from .build import build

__all__ = ["build", "render", "timeline"]
