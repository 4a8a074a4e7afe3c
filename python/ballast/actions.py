"""Recovery actions for a trainer: handlers registered per action, run in the
training thread at a step boundary (poll()), whether the action came from a
policy on the bus (recovery.action) or from the executor's control file
(ballast.job)."""
import collections
import threading

from . import events


class Actions:
    """on(name, fn) registers fn(action) for "checkpoint_now", "pause",
    "stop", ...; deliver() queues an action from any thread; poll() runs the
    queued ones in the caller's thread and returns them. An action whose
    subject names another rank or node is ignored. "stop" also sets
    `stopping`; "pause" blocks poll() until a "resume" or "stop" arrives
    unless a handler for it is registered."""

    def __init__(self, rank=None, node=None):
        self.rank = rank
        self.node = node
        self.stopping = False
        self._handlers = {}
        self._queue = collections.deque()
        self._cond = threading.Condition()

    def on(self, action, fn=None):
        """Register fn for action; usable as a decorator."""
        if fn is None:
            return lambda f: self.on(action, f)
        self._handlers.setdefault(action, []).append(fn)
        return fn

    def concerns_me(self, subject):
        if not subject:
            return True
        if subject.startswith("rank:"):
            try:
                return self.rank is None or int(subject[5:]) == self.rank
            except ValueError:
                return False
        return self.node is None or subject == self.node

    def deliver(self, action):
        """Queue an Action (or a recovery.action payload dict). Any thread."""
        if isinstance(action, dict):
            action = events.Action(action["action"], action.get("subject"), action.get("reason"),
                                   action.get("args"), action.get("policy"))
        if not self.concerns_me(action.subject):
            return
        with self._cond:
            self._queue.append(action)
            self._cond.notify_all()

    def subscribe(self, host):
        """Deliver the host's recovery.action events here."""
        return host.subscribe(events.RECOVERY_ACTION, lambda ev: self.deliver(events.action_of(ev)))

    def poll(self):
        """Run the handlers of the queued actions, in order, in this thread."""
        done = []
        while True:
            with self._cond:
                if not self._queue:
                    return done
                action = self._queue.popleft()
            done.append(action)
            if action.action == "stop":
                self.stopping = True
            for fn in self._handlers.get(action.action, []):
                fn(action)
            if action.action == "pause" and not self._handlers.get("pause"):
                self._wait_resume()

    def _wait_resume(self):
        with self._cond:
            while True:
                for k, a in enumerate(self._queue):
                    if a.action in ("resume", "stop"):
                        del self._queue[k]
                        if a.action == "stop":
                            self._queue.appendleft(a)
                        return
                self._cond.wait()
