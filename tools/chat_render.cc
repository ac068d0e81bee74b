// llm-chat-render: renders a chat template with the C++ engine, for the differential test
// against Python jinja2 and for looking at a model's prompt by hand.
//   llm-chat-render --template FILE --input FILE [--now EPOCH_SECONDS]
// The input is a JSON object {"messages": [...], "tools": ..., "add_generation_prompt": bool,
// "extra": {...}}. Prints the rendered prompt; on an error prints "ERROR <code>: <message>" to
// stderr and exits 2 (3 when the template called raise_exception).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "text/chat/chat_template.h"

int main(int argc, char** argv) {
  std::string template_path, input_path;
  long long now = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--template") {
      template_path = argv[i + 1];
    } else if (flag == "--input") {
      input_path = argv[i + 1];
    } else if (flag == "--now") {
      now = std::atoll(argv[i + 1]);
    } else {
      std::cerr << "unknown option " << flag << "\n";
      return 2;
    }
  }
  if (template_path.empty() || input_path.empty()) {
    std::cerr << "usage: llm-chat-render --template FILE --input FILE [--now EPOCH_SECONDS]\n";
    return 2;
  }
  auto src = llm::LoadChatTemplateSource("", template_path);
  if (!src.ok()) {
    std::cerr << "ERROR " << src.status().ToString() << "\n";
    return 2;
  }
  auto tmpl = llm::ChatTemplate::Create(src->text);
  if (!tmpl.ok()) {
    std::cerr << "ERROR " << tmpl.status().ToString() << "\n";
    return 2;
  }
  std::ifstream f(input_path);
  std::stringstream ss;
  ss << f.rdbuf();
  auto in = nlohmann::ordered_json::parse(ss.str(), nullptr, false);
  if (in.is_discarded() || !in.is_object()) {
    std::cerr << "ERROR input is not a JSON object\n";
    return 2;
  }
  llm::ChatRenderRequest req;
  req.messages = in.value("messages", nlohmann::ordered_json::array());
  if (in.contains("tools")) req.tools = in["tools"];
  req.add_generation_prompt = in.value("add_generation_prompt", false);
  if (in.contains("extra")) req.extra = in["extra"];
  if (now >= 0) req.now = static_cast<std::time_t>(now);
  auto out = tmpl->Render(req);
  if (!out.ok()) {
    std::cerr << "ERROR " << out.status().ToString() << "\n";
    return out.status().code() == llm::StatusCode::kFailedPrecondition ? 3 : 2;
  }
  std::fwrite(out->data(), 1, out->size(), stdout);
  return 0;
}
