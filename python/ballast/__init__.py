"""Ballast from Python: the embedded host (libballast through ctypes),
typed helpers for the well-known events, and for trainers a step timer, a
heartbeat, recovery-action handlers and the executor's job channel."""
from . import checkpoint
from ._native import Error
from .actions import Actions
from .events import Action
from .heartbeat import Heartbeat
from .host import Host, plugin_dir, to_lua
from .job import Job, write_atomically
from .timer import StepTimer, publish_to

__all__ = ["checkpoint", "Error", "Host", "Actions", "Action", "Heartbeat", "StepTimer", "Job", "publish_to", "plugin_dir",
           "to_lua", "write_atomically"]
