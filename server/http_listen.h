// Binds a cpp-httplib server to "host:port" (port 0: any free port) and serves it on its own
// thread. Shared by the metrics endpoint and the OpenAI HTTP API.
#pragma once

#include <string>
#include <thread>

#include "base/status.h"

namespace httplib {
class Server;
}

namespace llm {

// The bound port, or InvalidArgument / Unavailable naming `option` (the flag the address came
// from). On success `thread` runs the server's accept loop until server->stop().
StatusOr<int> ListenHttp(httplib::Server* server, const std::string& address,
                         const std::string& option, std::thread* thread);

}  // namespace llm
