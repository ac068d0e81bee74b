#include "engine/layers/cpu/cpu_weights.h"

namespace llm {

Status ReadStacked(const WeightStore& w, const std::string& prefix,
                   std::span<const StackedPart> parts, int64_t cols, bool bias,
                   std::vector<float>* out, std::vector<float>* b) {
  out->clear();
  if (b != nullptr) b->clear();
  std::vector<float> tmp;
  for (const StackedPart& p : parts) {
    LLM_RETURN_IF_ERROR(w.ReadF32(prefix + p.name + ".weight", {p.rows, cols}, &tmp));
    out->insert(out->end(), tmp.begin(), tmp.end());
    if (bias) {
      LLM_RETURN_IF_ERROR(w.ReadF32(prefix + p.name + ".bias", {p.rows}, &tmp));
      b->insert(b->end(), tmp.begin(), tmp.end());
    }
  }
  return Status::Ok();
}

Status ReadEmbeddingAndHead(const WeightStore& w, const ModelConfig& c, std::vector<float>* embed,
                            std::vector<float>* lm_head, const std::string& embed_name,
                            const std::string& head_name) {
  const int64_t v = c.vocab_size, h = c.hidden_size;
  LLM_RETURN_IF_ERROR(w.ReadF32(embed_name, {v, h}, embed));
  lm_head->clear();
  if (!c.tie_word_embeddings) return w.ReadF32(head_name, {v, h}, lm_head);
  if (!w.Has(head_name)) return Status::Ok();
  // A tied checkpoint may still store the head; HF then ties it (drops it). Accept only a copy.
  std::vector<float> head;
  LLM_RETURN_IF_ERROR(w.ReadF32(head_name, {v, h}, &head));
  if (head != *embed) {
    return InvalidArgument("tie_word_embeddings is true but " + head_name + " differs from " +
                           embed_name);
  }
  return Status::Ok();
}

}  // namespace llm
