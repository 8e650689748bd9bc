"""What each NFS op costs on the wire, counted: a relay on 127.0.0.1 between one libnfs
client and the server that reads every ONC RPC call going through (RFC 5531 record
marking over TCP) and names it: NFSv3's procedure, or NFSv4's COMPOUND with its
operations (RFC 7530), read as far as their arguments can be skipped.

libnfs 4.0 has no statistics call, and the relay never sits in a timed path: the NFS
backend's rpc_probe runs one of each op through it, untimed, and counts the calls each
made (each op is synchronous, and the relay forwards a call only after counting it, so
when the op returns its calls are counted). The stdlib only; threads.
"""

from __future__ import annotations

import socket
import struct
import threading
from contextlib import suppress

NFS_PROGRAM = 100003
V3_PROCEDURES = ("NULL", "GETATTR", "SETATTR", "LOOKUP", "ACCESS", "READLINK", "READ", "WRITE",
                 "CREATE", "MKDIR", "SYMLINK", "MKNOD", "REMOVE", "RMDIR", "RENAME", "LINK",
                 "READDIR", "READDIRPLUS", "FSSTAT", "FSINFO", "PATHCONF", "COMMIT")
V4_OPERATIONS = {3: "ACCESS", 4: "CLOSE", 5: "COMMIT", 6: "CREATE", 7: "DELEGPURGE",
                 8: "DELEGRETURN", 9: "GETATTR", 10: "GETFH", 11: "LINK", 12: "LOCK",
                 13: "LOCKT", 14: "LOCKU", 15: "LOOKUP", 16: "LOOKUPP", 17: "NVERIFY",
                 18: "OPEN", 19: "OPENATTR", 20: "OPEN_CONFIRM", 21: "OPEN_DOWNGRADE",
                 22: "PUTFH", 23: "PUTPUBFH", 24: "PUTROOTFH", 25: "READ", 26: "READDIR",
                 27: "READLINK", 28: "REMOVE", 29: "RENAME", 30: "RENEW", 31: "RESTOREFH",
                 32: "SAVEFH", 33: "SECINFO", 34: "SETATTR", 35: "SETCLIENTID",
                 36: "SETCLIENTID_CONFIRM", 37: "VERIFY", 38: "WRITE", 39: "RELEASE_LOCKOWNER"}


class Reader:
    """XDR decoding of one message: 4-byte units, opaques padded to 4."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def u32(self) -> int:
        value: int = struct.unpack_from(">I", self.data, self.at)[0]
        self.at += 4
        return value

    def skip(self, nbytes: int) -> None:
        self.at += nbytes
        if self.at > len(self.data):
            raise ValueError("past the end")

    def opaque(self) -> None:
        self.skip(-(-self.u32() // 4) * 4)

    def bitmap(self) -> None:
        self.skip(4 * self.u32())


# NFSv4 operations whose arguments are skipped to read the next: bytes of fixed fields,
# then how many opaques (file handles, names), then whether a bitmap follows
_V4_ARGUMENTS = {10: (0, 0), 16: (0, 0), 23: (0, 0), 24: (0, 0), 31: (0, 0), 32: (0, 0),
                 27: (0, 0), 22: (0, 1), 15: (0, 1), 28: (0, 1), 29: (0, 2), 3: (4, 0),
                 25: (28, 0), 5: (12, 0), 4: (20, 0), 30: (8, 0)}


def v4_operations(reader: Reader) -> list[str]:
    """A COMPOUND's operations (after its tag and minor version), as far as they can be
    read: an operation whose arguments are not skipped here ends the list, named."""
    reader.opaque()                 # tag
    reader.u32()                    # minorversion
    names = []
    for _ in range(reader.u32()):
        code = reader.u32()
        names.append(V4_OPERATIONS.get(code, f"OP{code}"))
        if code == 9:               # GETATTR: a bitmap
            reader.bitmap()
        elif code == 38:            # WRITE: stateid, offset, stable, then its data
            reader.skip(16 + 8 + 4)
            reader.opaque()
        elif code in _V4_ARGUMENTS:
            fixed, opaques = _V4_ARGUMENTS[code]
            reader.skip(fixed)
            for _ in range(opaques):
                reader.opaque()
        else:
            break
    return names


def call_name(message: bytes) -> str | None:
    """One RPC message's name ("GETATTR", "COMPOUND(PUTFH GETATTR)"); None for a reply
    or a call that is not NFS's."""
    try:
        reader = Reader(message)
        reader.u32()                                  # xid
        if reader.u32() != 0:                         # msg_type: 0 = CALL
            return None
        reader.u32()                                  # rpcvers
        program, version, procedure = reader.u32(), reader.u32(), reader.u32()
        if program != NFS_PROGRAM:
            return f"program {program}"
        reader.u32()
        reader.opaque()                               # credential
        reader.u32()
        reader.opaque()                               # verifier
        if version == 4:
            if procedure == 0:
                return "NULL"
            return f"COMPOUND({' '.join(v4_operations(reader))})"
        return V3_PROCEDURES[procedure] if procedure < len(V3_PROCEDURES) else f"PROC{procedure}"
    except (ValueError, struct.error, IndexError):
        return "unreadable"


class CountingRelay:
    """Listens on 127.0.0.1 (a free port), relays each connection to (host, port), and
    appends the name of every call the client sends to `calls`."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.calls: list[str] = []
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def count(self) -> int:
        with self.lock:
            return len(self.calls)

    def since(self, start: int) -> list[str]:
        with self.lock:
            return self.calls[start:]

    def close(self) -> None:
        for sock in self.sockets:
            with suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self.sockets += [client, server]
            threading.Thread(target=self._calls, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with suppress(OSError):
            while data := source.recv(1 << 16):
                sink.sendall(data)
        with suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def _calls(self, source: socket.socket, sink: socket.socket) -> None:
        """Client to server: record by record (RFC 5531 record marking), each whole message
        counted before it is forwarded."""
        pending, message = b"", b""
        with suppress(OSError):
            while data := source.recv(1 << 16):
                pending += data
                forward = b""
                while len(pending) >= 4:
                    mark = struct.unpack_from(">I", pending)[0]
                    length = mark & 0x7FFFFFFF
                    if len(pending) < 4 + length:
                        break
                    fragment, pending = pending[4:4 + length], pending[4 + length:]
                    forward += struct.pack(">I", mark) + fragment
                    message += fragment
                    if mark & 0x80000000:     # the last fragment: a whole message
                        name = call_name(message)
                        message = b""
                        if name is not None:
                            with self.lock:
                                self.calls.append(name)
                if forward:
                    sink.sendall(forward)
        with suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
