#include "server/http_listen.h"

#include <httplib.h>

namespace llm {

StatusOr<int> ListenHttp(httplib::Server* server, const std::string& address,
                         const std::string& option, std::thread* thread) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return InvalidArgument(option + " must be host:port");
  const std::string host = address.substr(0, colon);
  int port = 0;
  try {
    size_t used = 0;
    port = std::stoi(address.substr(colon + 1), &used);
    if (used != address.size() - colon - 1 || port < 0 || port > 65535) throw std::out_of_range("");
  } catch (const std::exception&) {
    return InvalidArgument(option + " has a bad port: " + address);
  }
  if (port == 0) {
    port = server->bind_to_any_port(host);
  } else if (!server->bind_to_port(host, port)) {
    port = -1;
  }
  if (port <= 0) return Unavailable("cannot bind " + option + " " + address);
  *thread = std::thread([server] { server->listen_after_bind(); });
  return port;
}

}  // namespace llm
