"""libballast through ctypes: the library, the C structs the package needs,
and C failures turned into Python exceptions."""
import ctypes
import ctypes.util
import os

from . import _paths


class Error(Exception):
    """A libballast call failed: `status` is its BALLAST_E* code, the message
    that of ballast_last_error()."""

    def __init__(self, call, status, message):
        super().__init__(f"{call}: {message or 'failed'} (status {status})")
        self.call = call
        self.status = status
        self.message = message


class Source(ctypes.Structure):
    _fields_ = [("node", ctypes.c_char_p), ("rank", ctypes.c_int32), ("plugin", ctypes.c_char_p)]


class Event(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("schema", ctypes.c_uint32), ("topic", ctypes.c_char_p),
                ("ts_ns", ctypes.c_int64), ("source", Source), ("payload", ctypes.c_void_p),
                ("payload_size", ctypes.c_uint64)]


class SubscribeOptions(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("delivery", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("queue_capacity", ctypes.c_uint32)]


HANDLER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(Event))

DELIVER_INLINE = 0
DELIVER_QUEUED = 1
SUBSCRIBE_LOSSY = 1


def _candidates(explicit):
    if explicit:
        yield explicit
        return
    env = os.environ.get("BALLAST_LIB")
    if env:
        yield env
        return
    if _paths.LIBDIR:
        yield os.path.join(_paths.LIBDIR, "libballast.so")
    found = ctypes.util.find_library("ballast")
    if found:
        yield found


_cache = {}


def load(path=None):
    """The libballast CDLL, its signatures declared. Search order: `path`,
    $BALLAST_LIB, the library installed beside this package, the linker's
    search path."""
    tried = []
    for candidate in _candidates(path):
        if candidate in _cache:
            return _cache[candidate]
        try:
            lib = ctypes.CDLL(candidate)
        except OSError as e:
            tried.append(f"{candidate}: {e}")
            continue
        _declare(lib)
        lib._ballast_path = candidate
        _cache[candidate] = lib
        return lib
    raise Error("load libballast", -3,
                "libballast.so not found (" + ("; ".join(tried) or "set BALLAST_LIB to its path") + ")")


def _declare(lib):
    vp, cp, u64p = ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64)
    lib.ballast_last_error.restype = cp
    lib.ballast_last_error.argtypes = []
    lib.ballast_abi_version.restype = ctypes.c_uint32
    lib.ballast_host_create.argtypes = [cp, ctypes.POINTER(vp)]
    lib.ballast_host_destroy.argtypes = [vp]
    lib.ballast_host_destroy.restype = None
    lib.ballast_host_load_plugin.argtypes = [vp, cp, cp]
    lib.ballast_host_load_policy.argtypes = [vp, cp, cp]
    lib.ballast_host_reload_policy.argtypes = [vp]
    lib.ballast_host_start.argtypes = [vp]
    lib.ballast_host_run.argtypes = [vp, ctypes.c_int]
    lib.ballast_host_stop.argtypes = [vp]
    lib.ballast_host_publish_json.argtypes = [vp, cp, cp]
    lib.ballast_host_subscribe.argtypes = [vp, cp, ctypes.POINTER(SubscribeOptions), HANDLER, vp, u64p]
    lib.ballast_host_unsubscribe.argtypes = [vp, ctypes.c_uint64]
    lib.ballast_event_to_json.argtypes = [ctypes.POINTER(Event), cp, ctypes.c_uint64]
    lib.ballast_event_to_json.restype = ctypes.c_int64
    lib.ballast_host_counter.argtypes = [vp, cp, ctypes.POINTER(ctypes.c_int64)]
    for name in ("ballast_host_create", "ballast_host_load_plugin", "ballast_host_load_policy",
                 "ballast_host_reload_policy", "ballast_host_start", "ballast_host_run", "ballast_host_stop",
                 "ballast_host_publish_json", "ballast_host_subscribe", "ballast_host_unsubscribe",
                 "ballast_host_counter"):
        getattr(lib, name).restype = ctypes.c_int


def check(lib, status, call):
    """Raise Error with ballast_last_error()'s message when status is not 0."""
    if status != 0:
        message = lib.ballast_last_error()
        raise Error(call, status, message.decode("utf-8", "replace") if message else "")
    return status
