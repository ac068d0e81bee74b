#include "engine/choice_fan_in.h"

namespace llm {
namespace {

struct FanIn {
  std::shared_ptr<ResultSink> sink;
  int open = 0;  // choices not finished yet
  bool ended = false;
  Usage usage;

  void OnChoice(int index, GenerationOutput out) {
    if (ended) return;
    out.index = index;
    if (!out.error.ok()) {
      ended = true;
      sink->OnOutput(std::move(out));
      return;
    }
    if (out.finished) {
      if (index == 0 || usage.prompt_tokens == 0) {
        usage.prompt_tokens = out.usage.prompt_tokens;
      }
      if (index == 0) usage.cached_tokens = out.usage.cached_tokens;
      usage.completion_tokens += out.usage.completion_tokens;
      ended = --open == 0;
      out.finished = ended;
      out.usage = ended ? usage : Usage{};
    }
    sink->OnOutput(std::move(out));
  }
};

class ChoiceSink final : public ResultSink {
 public:
  ChoiceSink(std::shared_ptr<FanIn> fan_in, int index)
      : fan_in_(std::move(fan_in)), index_(index) {}
  void OnOutput(GenerationOutput out) override { fan_in_->OnChoice(index_, std::move(out)); }

 private:
  std::shared_ptr<FanIn> fan_in_;
  int index_;
};

}  // namespace

std::vector<std::shared_ptr<ResultSink>> FanInChoices(std::shared_ptr<ResultSink> sink, int n) {
  auto fan_in = std::make_shared<FanIn>();
  fan_in->sink = std::move(sink);
  fan_in->open = n;
  std::vector<std::shared_ptr<ResultSink>> sinks;
  for (int i = 0; i < n; ++i) sinks.push_back(std::make_shared<ChoiceSink>(fan_in, i));
  return sinks;
}

}  // namespace llm
