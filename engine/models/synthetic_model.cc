#include "engine/models/synthetic_model.h"

#include <algorithm>
#include <sstream>

namespace llm {

StatusOr<std::unique_ptr<Model>> SyntheticModel::Create(const ModelLoadOptions& options) {
  auto m = std::make_unique<SyntheticModel>();
  ModelConfig& c = m->config_;
  c.name = "synthetic";
  c.architecture_name = "synthetic";
  c.vocab_size = 32000;
  c.max_position_embeddings = 8192;
  c.num_layers = 1;
  c.hidden_size = c.num_q_heads = c.num_kv_heads = c.head_dim = 1;
  // "synthetic:vocab=1000,max_len=4096"
  const std::string& dir = options.model_dir;
  const size_t colon = dir.find(':');
  if (colon != std::string::npos) {
    std::stringstream ss(dir.substr(colon + 1));
    std::string kv;
    while (std::getline(ss, kv, ',')) {
      const size_t eq = kv.find('=');
      const std::string k = kv.substr(0, eq);
      const int v = eq == std::string::npos ? 0 : std::atoi(kv.c_str() + eq + 1);
      if (v <= 0) return InvalidArgument("synthetic model option '" + kv + "' needs a value > 0");
      if (k == "vocab")
        c.vocab_size = v;
      else if (k == "max_len")
        c.max_position_embeddings = v;
      else
        return InvalidArgument("unknown synthetic model option '" + k + "'");
    }
  }
  m->num_blocks_ = options.num_kv_blocks > 0 ? options.num_kv_blocks : 65536;
  return std::unique_ptr<Model>(std::move(m));
}

Status SyntheticModel::Forward(const ForwardBatch& batch, std::vector<float>* logits) {
  const int v = config_.vocab_size;
  logits->assign(batch.logit_rows.size() * static_cast<size_t>(v), 0.0f);
  for (size_t r = 0; r < batch.logit_rows.size(); ++r) {
    const int row = batch.logit_rows[r];
    const uint64_t h = (static_cast<uint64_t>(batch.token_ids[row]) * 0x9E3779B97F4A7C15ull) ^
                       static_cast<uint64_t>(batch.positions[row]);
    (*logits)[r * v + (h >> 17) % v] = 10.0f;
  }
  return Status::Ok();
}

}  // namespace llm
