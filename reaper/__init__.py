"""reaper: an init (PID 1) and process reaper for Ray containers."""

__version__ = "0.1.0"
