"""Host: libballast's embedded host (abi/ballast/host.h) from Python."""
import ctypes
import json
import math
import os
import re
import socket
import sys
import threading

from . import _native, _paths
from ._native import Error

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LUA_KEYWORDS = {"and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto", "if", "in",
                 "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while"}
_MAX_DEPTH = 32


def to_lua(value, _depth=0):
    """A Lua table constructor (or literal) for a plugin's configuration:
    dicts with string keys, lists, str, int, float, bool and None."""
    if _depth > _MAX_DEPTH:
        raise ValueError(f"configuration nested deeper than {_MAX_DEPTH} levels")
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"configuration value {value!r} is not a finite number")
        return repr(value)
    if isinstance(value, str):
        # Byte by byte: printable ASCII as is, the rest as Lua's \ddd escapes.
        return "\"" + "".join(chr(b) if 32 <= b < 127 and b not in (34, 92) else f"\\{b:03d}"
                              for b in value.encode("utf-8")) + "\""
    if isinstance(value, (list, tuple)):
        return "{" + ", ".join(to_lua(v, _depth + 1) for v in value) + "}"
    if isinstance(value, dict):
        parts = []
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"configuration key {k!r} is not a string")
            key = k if _IDENT.match(k) and k not in _LUA_KEYWORDS else "[" + to_lua(k) + "]"
            parts.append(f"{key} = {to_lua(v, _depth + 1)}")
        return "{ " + ", ".join(parts) + " }"
    raise ValueError(f"configuration value {value!r} ({type(value).__name__}) has no Lua form")


def plugin_dir():
    """The folder of the bundled plugins: $BALLAST_PLUGIN_DIR, else the
    installed one, else None."""
    return os.environ.get("BALLAST_PLUGIN_DIR") or _paths.PLUGINDIR


class Host:
    """An embedded Ballast host: load plugins and a policy, publish,
    subscribe, run. Every failing call raises ballast.Error with libballast's
    message. Use as a context manager, or call close()."""

    def __init__(self, node=None, lib=None):
        self._lib = _native.load(lib)
        self._ptr = ctypes.c_void_p()
        node = node or socket.gethostname()
        _native.check(self._lib, self._lib.ballast_host_create(node.encode(), ctypes.byref(self._ptr)),
                      "ballast_host_create")
        self._handlers = {}  # subscription id -> the ctypes callback, kept alive while subscribed
        self._lock = threading.Lock()
        self.handler_errors = 0

    @property
    def lib(self):
        return self._lib

    def _call(self, name, *args):
        if not self._ptr:
            raise Error(name, -8, "the host is closed")
        return _native.check(self._lib, getattr(self._lib, name)(self._ptr, *args), name)

    def load_plugin(self, plugin, config=None):
        """Load a plugin: a path to its shared object, or a bundled plugin's
        name ("hang", "straggler", ...) looked up in plugin_dir(). `config`: a
        dict (turned into a Lua table) or a Lua table constructor string."""
        path = plugin
        if os.sep not in plugin and not plugin.endswith(".so"):
            folder = plugin_dir()
            if not folder:
                raise Error("ballast_host_load_plugin", -3,
                            f"plugin '{plugin}' named without a path and no plugin folder known "
                            "(set BALLAST_PLUGIN_DIR)")
            path = os.path.join(folder, f"ballast-{plugin}.so")
        text = config if isinstance(config, str) or config is None else to_lua(config)
        self._call("ballast_host_load_plugin", path.encode(), text.encode() if text is not None else None)

    def load_policy(self, script, fallback="escalate"):
        self._call("ballast_host_load_policy", os.fspath(script).encode(), fallback.encode() if fallback else None)

    def reload_policy(self):
        self._call("ballast_host_reload_policy")

    def start(self):
        self._call("ballast_host_start")

    def run(self, handle_signals=True):
        """Block until stop() (any thread) or, with handle_signals, SIGINT or
        SIGTERM. Main thread."""
        self._call("ballast_host_run", 1 if handle_signals else 0)

    def stop(self):
        self._call("ballast_host_stop")

    def publish(self, topic, payload):
        """Publish `payload` (a dict, or JSON text) under `topic`. Well-known
        topics are converted to their C struct (see ballast.events)."""
        text = payload if isinstance(payload, str) else json.dumps(payload, allow_nan=False)
        self._call("ballast_host_publish_json", topic.encode(), text.encode())

    def subscribe(self, pattern, fn, queued=True, lossy=False, queue_capacity=0):
        """Call fn(event) for each event matching `pattern` ("step.timing",
        "fault.*"); event is a dict {"topic","ts","source","schema","payload"}.
        queued: from a dispatcher thread (default), else inline in the
        publisher's thread. An exception in fn is printed and counted
        (handler_errors), never passed into C. Returns the subscription id."""
        lib = self._lib

        def trampoline(_user, event_ptr):
            try:
                cap = 4096
                while True:
                    buf = ctypes.create_string_buffer(cap)
                    n = lib.ballast_event_to_json(event_ptr, buf, cap)
                    if n < 0:
                        raise Error("ballast_event_to_json", int(n), lib.ballast_last_error().decode())
                    if n < cap:
                        break
                    cap = n + 1
                fn(json.loads(buf.value.decode("utf-8")))
                return 0
            except BaseException as e:  # never across the C boundary
                with self._lock:
                    self.handler_errors += 1
                print(f"ballast: handler for '{pattern}' failed: {e!r}", file=sys.stderr)
                return -1

        handler = _native.HANDLER(trampoline)
        opts = _native.SubscribeOptions(ctypes.sizeof(_native.SubscribeOptions),
                                        _native.DELIVER_QUEUED if queued else _native.DELIVER_INLINE,
                                        _native.SUBSCRIBE_LOSSY if lossy else 0, queue_capacity)
        sub = ctypes.c_uint64()
        self._call("ballast_host_subscribe", pattern.encode(), ctypes.byref(opts), handler, None, ctypes.byref(sub))
        with self._lock:
            self._handlers[sub.value] = handler
        return sub.value

    def unsubscribe(self, subscription):
        self._call("ballast_host_unsubscribe", ctypes.c_uint64(subscription))
        with self._lock:
            self._handlers.pop(subscription, None)

    def counter(self, name):
        value = ctypes.c_int64()
        self._call("ballast_host_counter", name.encode(), ctypes.byref(value))
        return value.value

    def close(self):
        """Stop and destroy the host (plugins stopped, queues drained)."""
        if self._ptr:
            self._lib.ballast_host_destroy(self._ptr)
            self._ptr = ctypes.c_void_p()
            self._handlers.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
