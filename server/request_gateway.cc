#include "server/request_gateway.h"

namespace llm {

Status RequestGateway::Submit(const GenerateParams& params,
                              std::optional<std::chrono::steady_clock::time_point> deadline,
                              std::shared_ptr<ResultSink> sink, std::string* request_id,
                              std::string* rendered_chat) {
  if (!accepting_) return Unavailable("server is shutting down");
  GenerationRequest req;
  LLM_RETURN_IF_ERROR(ConvertRequest(params, engine_->core(), config_, chat_, &req, rendered_chat));
  req.deadline = deadline;
  return engine_->Submit(std::move(req), std::move(sink), request_id);
}

}  // namespace llm
