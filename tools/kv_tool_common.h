// Shared by llm-calibrate-kv and llm-kv-accuracy: their command line, prompt files and a small
// driver that runs several sequences through a Model's paged forward pass (chunked prefill, then
// decode steps), without the scheduler.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "engine/runtime/model.h"
#include "text/tokenizer/tokenizer.h"

namespace llm::tools {

// Prompts from `path`: a .json file of token ids (`[[ids...], ...]`, `{"prompts": [[...]]}` or
// llm-dump's `{"requests": [{"prompt_ids": [...]}]}`), or a text file with one prompt per line
// (empty lines skipped) encoded with the model directory's tokenizer.json.
inline StatusOr<std::vector<std::vector<int32_t>>> LoadPrompts(const std::string& path,
                                                               const std::string& model_dir) {
  std::vector<std::vector<int32_t>> prompts;
  std::ifstream in(path);
  if (!in) return NotFound("cannot open prompts file " + path);
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return InvalidArgument(path + " is not valid JSON");
    nlohmann::json list = j;
    if (j.is_object() && j.contains("prompts")) list = j["prompts"];
    if (j.is_object() && j.contains("requests")) {
      list = nlohmann::json::array();
      for (const auto& r : j["requests"]) list.push_back(r.value("prompt_ids", nlohmann::json()));
    }
    if (!list.is_array()) return InvalidArgument(path + ": expected a list of token-id lists");
    for (const auto& p : list) {
      if (!p.is_array() || p.empty()) {
        return InvalidArgument(path + ": every prompt must be a non-empty list of token ids");
      }
      std::vector<int32_t> ids;
      for (const auto& e : p) {
        if (!e.is_number_integer()) return InvalidArgument(path + ": token ids must be integers");
        ids.push_back(e.get<int32_t>());
      }
      prompts.push_back(std::move(ids));
    }
  } else {
    LLM_ASSIGN_OR_RETURN(auto tok, Tokenizer::FromFile(model_dir + "/tokenizer.json"));
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty()) continue;
      std::vector<int32_t> ids = tok->Encode(line, /*add_special_tokens=*/true);
      if (!ids.empty()) prompts.push_back(std::move(ids));
    }
  }
  if (prompts.empty()) return InvalidArgument(path + " holds no prompt");
  return prompts;
}

// Runs num_seqs sequences through `model`. Blocks are handed out in the order sequences grow,
// so consecutive blocks of one sequence are usually not adjacent (as in the real allocator).
class SequenceRunner {
 public:
  SequenceRunner(Model* model, int block_size, int num_seqs)
      : model_(model), block_size_(block_size), pages_(num_seqs), lens_(num_seqs, 0) {}

  int len(int seq) const { return lens_[seq]; }

  // Appends tokens[s] (possibly none) to every sequence s in one forward pass. logits[s] gets
  // the logits after the last new token of s (left empty for sequences without tokens).
  Status Step(const std::vector<std::vector<int32_t>>& tokens,
              std::vector<std::vector<float>>* logits) {
    ForwardBatch b;
    AttentionBatch& a = b.attn;
    a.q_indptr = {0};
    a.page_indptr = {0};
    std::vector<int> sampled;
    for (size_t s = 0; s < tokens.size(); ++s) {
      if (tokens[s].empty()) continue;
      for (int32_t id : tokens[s]) {
        const int pos = lens_[s]++;
        if (pos % block_size_ == 0) {
          if (next_block_ >= model_->num_kv_blocks()) {
            return ResourceExhausted("out of KV blocks (" +
                                     std::to_string(model_->num_kv_blocks()) + ")");
          }
          pages_[s].push_back(next_block_++);
        }
        b.token_ids.push_back(id);
        b.positions.push_back(pos);
        a.slot_mapping.push_back(pages_[s][pos / block_size_] * block_size_ + pos % block_size_);
      }
      a.q_indptr.push_back(static_cast<int32_t>(b.token_ids.size()));
      a.kv_lens.push_back(lens_[s]);
      a.page_indices.insert(a.page_indices.end(), pages_[s].begin(), pages_[s].end());
      a.page_indptr.push_back(static_cast<int32_t>(a.page_indices.size()));
      b.logit_rows.push_back(static_cast<int32_t>(b.token_ids.size()) - 1);
      sampled.push_back(static_cast<int>(s));
    }
    a.num_seqs = static_cast<int>(sampled.size());
    a.num_tokens = static_cast<int>(b.token_ids.size());
    logits->assign(tokens.size(), {});
    if (a.num_tokens == 0) return Status::Ok();
    std::vector<float> out;
    LLM_RETURN_IF_ERROR(model_->Forward(b, &out));
    const size_t vocab = static_cast<size_t>(model_->config().vocab_size);
    for (size_t r = 0; r < sampled.size(); ++r) {
      (*logits)[sampled[r]].assign(out.begin() + static_cast<long>(r * vocab),
                                   out.begin() + static_cast<long>((r + 1) * vocab));
    }
    return Status::Ok();
  }

  // Prefills every prompt in chunks of at most `chunk` tokens per sequence and step; returns the
  // logits after each prompt's last token.
  Status Prefill(const std::vector<std::vector<int32_t>>& prompts, int chunk,
                 std::vector<std::vector<float>>* last_logits) {
    last_logits->assign(prompts.size(), {});
    for (size_t done = 0;; done += static_cast<size_t>(chunk)) {
      std::vector<std::vector<int32_t>> step(prompts.size());
      bool any = false;
      for (size_t s = 0; s < prompts.size(); ++s) {
        if (done >= prompts[s].size()) continue;
        const size_t end = std::min(prompts[s].size(), done + static_cast<size_t>(chunk));
        step[s].assign(prompts[s].begin() + static_cast<long>(done),
                       prompts[s].begin() + static_cast<long>(end));
        any = true;
      }
      if (!any) return Status::Ok();
      std::vector<std::vector<float>> logits;
      LLM_RETURN_IF_ERROR(Step(step, &logits));
      for (size_t s = 0; s < prompts.size(); ++s) {
        if (!logits[s].empty()) (*last_logits)[s] = std::move(logits[s]);
      }
    }
  }

 private:
  Model* model_;
  int block_size_;
  int next_block_ = 0;
  std::vector<std::vector<int32_t>> pages_;
  std::vector<int> lens_;
};

inline int32_t Argmax(const std::vector<float>& x) {
  return static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
}

// A tool's command line: "--key value" pairs.
class Flags {
 public:
  // False, for the caller to print its usage, when an argument is not a "--key value" pair or a
  // key in `required` is missing.
  bool Parse(int argc, char** argv, std::initializer_list<const char*> required) {
    for (int i = 1; i < argc; i += 2) {
      if (i + 1 >= argc || std::string(argv[i]).rfind("--", 0) != 0) return false;
      values_[argv[i]] = argv[i + 1];
    }
    for (const char* key : required) {
      if (!values_.count(key)) return false;
    }
    return true;
  }
  std::string Get(const std::string& key, const std::string& def = "") const {
    const auto it = values_.find(key);
    return it == values_.end() ? def : it->second;
  }
  int GetInt(const std::string& key, int def) const {
    const auto it = values_.find(key);
    return it == values_.end() ? def : std::atoi(it->second.c_str());
  }

 private:
  std::map<std::string, std::string> values_;
};

// Reports `st` as "tool: message" on stderr; returns the tool's exit code for it.
inline int Fail(const char* tool, const Status& st) {
  std::fprintf(stderr, "%s: %s\n", tool, st.ToString().c_str());
  return 1;
}

}  // namespace llm::tools
