"""corral: a crash-safe job dispatcher.

No job is lost, no job is stuck, and no stale attempt can overwrite a newer one.
"""

from corral.client import Client, JobView
from corral.clock import Clock, SystemClock
from corral.config import Settings, Timeouts
from corral.dispatcher import Dispatcher
from corral.errors import CorralError
from corral.model import Attempt, AttemptState, Event, Job, JobState, Launch, Observation, Phase
from corral.runtime import connect
from corral.worker import CurrentAttempt, current_attempt

__all__ = [
    "Attempt",
    "AttemptState",
    "Client",
    "Clock",
    "CorralError",
    "CurrentAttempt",
    "Dispatcher",
    "Event",
    "Job",
    "JobState",
    "JobView",
    "Launch",
    "Observation",
    "Phase",
    "Settings",
    "SystemClock",
    "Timeouts",
    "connect",
    "current_attempt",
]
