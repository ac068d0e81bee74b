// The n choices of one request (n > 1) run as n child requests; their outputs meet here, in the
// request's one sink. Each output is tagged with its choice's index; a choice's last output
// carries its finish_reason, and only the request's very last output has `finished` set, with the
// usage of the whole request (prompt tokens once, completion tokens summed over the choices,
// cached tokens of choice 0). The first error ends the request: it is forwarded and everything
// after it is dropped. Engine thread only.
#pragma once

#include <memory>
#include <vector>

#include "engine/request.h"

namespace llm {

// The n sinks of a request's choices, in index order, feeding `sink`.
std::vector<std::shared_ptr<ResultSink>> FanInChoices(std::shared_ptr<ResultSink> sink, int n);

}  // namespace llm
