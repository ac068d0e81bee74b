// Closing connections that cpp-httplib 0.11 would keep open. Its handlers never see their
// socket, and it keeps a connection alive after an error response whose request body it did
// not read, or while a slow client trickles in a request head. These find the accepted sockets
// of a listening port among the process's descriptors (getsockname / getpeername) and shut them
// down, which ends the library's read loop on them. A socket shut for reading only still sends
// the response being written (shut before it, the library's write sees a dead peer).
#pragma once

#include <string>

namespace llm {

// The accepted socket of (local port, peer address as httplib writes it, peer port), or -1.
int ConnectionSocket(int local_port, const std::string& peer_addr, int peer_port);

// Reads and drops what the client is still sending (an unread body) until it pauses, closes, or
// `linger_ms` / `linger_bytes` run out, as nginx's lingering close does: a socket closed with
// unread data resets the connection, and the client could lose the response sent before.
void DiscardPending(int fd, int linger_ms, size_t linger_bytes);

// Shuts down (both ways) every accepted connection of `local_port`; returns how many.
int ShutdownConnections(int local_port);

}  // namespace llm
