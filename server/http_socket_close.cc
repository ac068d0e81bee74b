#include "server/http_socket_close.h"

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>

#include <cstdlib>
#include <vector>

namespace llm {
namespace {

int PortOf(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return -1;
}

// The process's TCP sockets whose local port is `local_port` and that have a peer (accepted
// connections, not the listener).
template <typename Fn>
int ForEachConnection(int local_port, Fn fn) {
  std::vector<int> fds;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (const dirent* e = readdir(dir)) {
      if (e->d_name[0] != '.') fds.push_back(std::atoi(e->d_name));
    }
    closedir(dir);
  }
  int n = 0;
  for (const int fd : fds) {
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof(local), pl = sizeof(peer);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;
    if (PortOf(local) != local_port) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    if (fn(fd, peer, pl)) ++n;
  }
  return n;
}

}  // namespace

void DiscardPending(int fd, int linger_ms, size_t linger_bytes) {
  constexpr int kLingerIdleMs = 100;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(linger_ms);
  char buf[16384];
  size_t total = 0;
  while (total < linger_bytes) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          end - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) return;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(std::min<int64_t>(left, kLingerIdleMs))) <= 0) return;
    const ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n <= 0) return;
    total += static_cast<size_t>(n);
  }
}

int ConnectionSocket(int local_port, const std::string& peer_addr, int peer_port) {
  int found = -1;
  ForEachConnection(local_port, [&](int fd, const sockaddr_storage& peer, socklen_t len) {
    if (PortOf(peer) != peer_port) return false;
    char host[NI_MAXHOST];
    // The same form httplib gives as Request::remote_addr.
    if (getnameinfo(reinterpret_cast<const sockaddr*>(&peer), len, host, sizeof(host), nullptr, 0,
                    NI_NUMERICHOST) != 0 ||
        peer_addr != host) {
      return false;
    }
    found = fd;
    return true;
  });
  return found;
}

int ShutdownConnections(int local_port) {
  return ForEachConnection(local_port, [](int fd, const sockaddr_storage&, socklen_t) {
    return shutdown(fd, SHUT_RDWR) == 0;
  });
}

}  // namespace llm
