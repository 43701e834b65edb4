"""An engine whose output channel (IOPub) joins the controller ``MPINB_TEST_IOPUB_DELAY`` seconds late.

ZMQ's publish sockets drop what they send before their subscriber's subscription arrives. An engine
connects its IOPub socket last (after its shell, its nanny and its control socket), so on a loaded
host it can answer requests while the controller has not yet subscribed to its output: the replies
arrive, the ``idle`` status that ends each request's output is dropped, and ipyparallel's
``execute(block=True)`` waited for it forever. Tests use this engine to hold that window open.
"""

import os
import sys

import zmq
from ipykernel import iostream

DELAY = float(os.environ.get("MPINB_TEST_IOPUB_DELAY", "4"))
_late: dict[int, str] = {}
_connect = zmq.Socket.connect


def connect(self, addr, *args, **kwargs):
    if self.socket_type == zmq.XPUB and not _late:  # the IOPub socket: connect it later, on its own thread
        _late[id(self)] = addr
        return None
    return _connect(self, addr, *args, **kwargs)


_start = iostream.IOPubThread.start


def start(self):
    _start(self)
    addr = _late.get(id(self.socket))
    if addr is not None:
        self.io_loop.add_callback(lambda: self.io_loop.call_later(DELAY, lambda: _connect(self.socket, addr)))


zmq.Socket.connect = connect
iostream.IOPubThread.start = start

from ipyparallel.engine.app import main  # noqa: E402

sys.argv[0] = "ipengine"
main()
