// Tests for ParseServerConfig: defaults, JSON file then flag overrides, and errors that name the
// offending flag or key.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "server/server_config.h"

namespace llm {
namespace {

namespace fs = std::filesystem;

class TempConfigFile {
 public:
  explicit TempConfigFile(const std::string& text) {
    std::random_device rd;
    path_ = fs::temp_directory_path() / ("llm_test_server_config_" + std::to_string(getpid()) +
                                         "_" + std::to_string(rd()) + ".json");
    std::ofstream out(path_, std::ios::trunc);
    out << text;
  }
  ~TempConfigFile() {
    std::error_code ec;
    fs::remove(path_, ec);
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST_CASE("ServerConfig defaults", "[server_config]") {
  const ServerConfig defaults;
  CHECK(defaults.listen_address == "127.0.0.1:50051");  // loopback unless configured

  // Only model_dir given: everything else keeps its default.
  auto c = ParseServerConfig({"--model-dir", "/models/tiny"});
  REQUIRE(c.ok());
  CHECK(c->listen_address == "127.0.0.1:50051");
  CHECK(c->model_dir == "/models/tiny");
  CHECK(c->block_size == defaults.block_size);
  CHECK(c->max_num_seqs == defaults.max_num_seqs);
  CHECK(c->max_batched_tokens == defaults.max_batched_tokens);
  CHECK(c->num_kv_blocks == defaults.num_kv_blocks);
  CHECK(c->kv_cache_memory_mb == defaults.kv_cache_memory_mb);
  CHECK(c->max_model_len == defaults.max_model_len);
  CHECK(c->max_tokens_limit == defaults.max_tokens_limit);
  CHECK(c->default_max_tokens == defaults.default_max_tokens);
  CHECK(c->max_prompt_bytes == defaults.max_prompt_bytes);
  CHECK(c->shutdown_grace_s == defaults.shutdown_grace_s);
  CHECK(c->log_level == defaults.log_level);
  CHECK(c->attention_backend.empty());
  // The defaults themselves are valid values.
  CHECK(defaults.block_size > 0);
  CHECK(defaults.max_num_seqs > 0);
  CHECK(defaults.max_batched_tokens > 0);
  CHECK(defaults.default_max_tokens <= defaults.max_tokens_limit);
}

TEST_CASE("ServerConfig JSON file then flags override", "[server_config]") {
  TempConfigFile file(R"({"model_dir": "/from/file", "max_num_seqs": 16, "block_size": 32,
                         "listen_address": "0.0.0.0:6000", "log_level": "debug"})");
  // The file applies first even when --config comes after a flag.
  auto c = ParseServerConfig(
      {"--max-num-seqs", "8", "--config", file.path(), "--max_batched_tokens=512"});
  REQUIRE(c.ok());
  CHECK(c->max_num_seqs == 8);          // flag beats file
  CHECK(c->block_size == 32);           // file
  CHECK(c->model_dir == "/from/file");  // file
  CHECK(c->listen_address == "0.0.0.0:6000");
  CHECK(c->log_level == "debug");
  CHECK(c->max_batched_tokens == 512);  // --key=value form with underscores

  auto c2 = ParseServerConfig({"--config", file.path(), "--model", "/from/flag",
                               "--cuda-graph-max-batch", "0", "--cuda-graph-warmup", "false"});
  REQUIRE(c2.ok());
  CHECK(c2->model_dir == "/from/flag");  // --model is short for --model-dir
  CHECK(c2->max_num_seqs == 16);
  CHECK(c2->ToEngineConfig().model.cuda_graph_max_batch == 0);  // graphs off
  CHECK_FALSE(c2->ToEngineConfig().model.cuda_graph_warmup);

  const EngineConfig e = c->ToEngineConfig();
  CHECK(e.model.cuda_graph_max_batch == 256);  // default: graphs on up to 256 sequences
  CHECK(e.model.cuda_graph_warmup);            // captured at start-up
  CHECK(e.scheduler.max_num_seqs == 8);
  CHECK(e.scheduler.max_batched_tokens == 512);
  CHECK(e.scheduler.block_size == 32);
  CHECK(e.model.model_dir == "/from/file");
  CHECK(e.model.block_size == 32);
  CHECK(e.model.mla_kernel == "auto");
  CHECK(e.model.c8_prefill == "auto");

  auto c3 = ParseServerConfig(
      {"--config", file.path(), "--mla-kernel", "portable", "--c8-prefill", "fmha"});
  REQUIRE(c3.ok());
  CHECK(c3->ToEngineConfig().model.mla_kernel == "portable");
  CHECK(c3->ToEngineConfig().model.c8_prefill == "fmha");
  CHECK(c3->ToEngineConfig().model.fp8_fast_accumulation);        // the default
  CHECK(c3->ToEngineConfig().model.fp8_static_attention_output);  // the default
  CHECK_FALSE(c3->ToEngineConfig().model.fused_decode_append);    // the default

  auto c4 = ParseServerConfig({"--config", file.path(), "--weight-dtype", "fp8",
                               "--fp8-fast-accumulation", "false", "--fp8-static-attention-output",
                               "false", "--fused-decode-append", "true"});
  REQUIRE(c4.ok());
  CHECK(c4->ToEngineConfig().model.weight_dtype == "fp8");
  CHECK_FALSE(c4->ToEngineConfig().model.fp8_fast_accumulation);
  CHECK_FALSE(c4->ToEngineConfig().model.fp8_static_attention_output);
  CHECK(c4->ToEngineConfig().model.fused_decode_append);
}

TEST_CASE("ServerConfig rejects bad values naming the field", "[server_config]") {
  SECTION("--max-num-seqs 0") {
    auto c = ParseServerConfig({"--model-dir", "/m", "--max-num-seqs", "0"});
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == StatusCode::kInvalidArgument);
    CHECK(Contains(c.status().message(), "max_num_seqs"));
  }
  SECTION("non-integer value") {
    auto c = ParseServerConfig({"--model-dir", "/m", "--block-size", "abc"});
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == StatusCode::kInvalidArgument);
    CHECK(Contains(c.status().message(), "block_size"));
    CHECK(Contains(c.status().message(), "abc"));
  }
  SECTION("integer with trailing junk") {
    auto c = ParseServerConfig({"--model-dir", "/m", "--block-size", "16x"});
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "block_size"));
  }
  SECTION("value out of int range") {
    auto c = ParseServerConfig({"--model-dir", "/m", "--max-batched-tokens", "99999999999999"});
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "max_batched_tokens"));
  }
  SECTION("bad value in the JSON file names the file and key") {
    TempConfigFile file(R"({"model_dir": "/m", "max_num_seqs": 0})");
    auto c = ParseServerConfig({"--config", file.path()});
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "max_num_seqs"));
    CHECK(Contains(c.status().message(), file.path()));
  }
  SECTION("negative CUDA graph batch") {
    auto c = ParseServerConfig({"--model-dir", "/m", "--cuda-graph-max-batch", "-1"});
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "cuda_graph_max_batch"));
  }
  SECTION("bad log level") {
    auto c = ParseServerConfig({"--model-dir", "/m", "--log-level", "loud"});
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "loud"));
  }
  SECTION("listen address without a port") {
    auto c = ParseServerConfig({"--model-dir", "/m", "--listen-address", "localhost"});
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "listen_address"));
  }
  SECTION("unknown MLA kernel") {
    auto c = ParseServerConfig({"--model-dir", "/m", "--mla-kernel", "fast"});
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == StatusCode::kInvalidArgument);
    CHECK(Contains(c.status().message(), "mla_kernel"));
    CHECK(Contains(c.status().message(), "'fast'"));
  }
  SECTION("unknown C8 prefill kernel") {
    auto c = ParseServerConfig({"--model-dir", "/m", "--c8-prefill", "tensor"});
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == StatusCode::kInvalidArgument);
    CHECK(Contains(c.status().message(), "c8_prefill"));
    CHECK(Contains(c.status().message(), "'tensor'"));
  }
  SECTION("default_max_tokens above max_tokens_limit") {
    auto c = ParseServerConfig(
        {"--model-dir", "/m", "--max-tokens-limit", "100", "--default-max-tokens", "200"});
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "default_max_tokens"));
  }
}

TEST_CASE("ServerConfig rejects unknown flags and keys naming them", "[server_config]") {
  SECTION("unknown flag") {
    auto c = ParseServerConfig({"--model-dir", "/m", "--bogus", "1"});
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == StatusCode::kInvalidArgument);
    CHECK(Contains(c.status().message(), "bogus"));
  }
  SECTION("unknown JSON key") {
    TempConfigFile file(R"({"model_dir": "/m", "turbo": 1})");
    auto c = ParseServerConfig({"--config", file.path()});
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "turbo"));
  }
  SECTION("positional argument") {
    auto c = ParseServerConfig({"--model-dir", "/m", "stray"});
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "stray"));
  }
  SECTION("flag without a value") {
    auto c = ParseServerConfig({"--model-dir", "/m", "--max-num-seqs"});
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "max-num-seqs"));
  }
  SECTION("missing config file") {
    auto c = ParseServerConfig({"--config", "/nonexistent/dir/server.json"});
    REQUIRE_FALSE(c.ok());
    CHECK(Contains(c.status().message(), "/nonexistent/dir/server.json"));
  }
  SECTION("config file that is not a JSON object") {
    TempConfigFile file("[1, 2]");
    auto c = ParseServerConfig({"--config", file.path()});
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == StatusCode::kInvalidArgument);
  }
}

TEST_CASE("ServerConfig requires model_dir", "[server_config]") {
  auto c = ParseServerConfig({});
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == StatusCode::kInvalidArgument);
  CHECK(Contains(c.status().message(), "model_dir"));
  auto c2 = ParseServerConfig({"--max-num-seqs", "4"});
  REQUIRE_FALSE(c2.ok());
  CHECK(Contains(c2.status().message(), "model_dir"));
}

TEST_CASE("ServerConfig --help returns FailedPrecondition with the usage text", "[server_config]") {
  for (const char* flag : {"--help", "-h"}) {
    // Even with other (valid or invalid) arguments around it.
    auto c = ParseServerConfig({"--model-dir", "/m", flag, "--bogus", "1"});
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == StatusCode::kFailedPrecondition);
    CHECK(c.status().message() == ServerUsage());
    CHECK(Contains(c.status().message(), "usage"));
    CHECK(Contains(c.status().message(), "max_num_seqs"));
    CHECK(Contains(c.status().message(), "model_dir"));
  }
}

TEST_CASE("Every shipped server config parses and maps to the engine", "[server_config]") {
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(LLM_CONFIGS_DIR)) {
    if (e.path().extension() != ".json") continue;
    ++files;
    INFO(e.path().string());
    auto c = ParseServerConfig({"--config", e.path().string()});
    INFO(c.status().ToString());
    REQUIRE(c.ok());
    const EngineConfig eng = c->ToEngineConfig();
    CHECK(eng.model.model_dir == c->model_dir);
    CHECK(eng.model.weight_dtype == c->weight_dtype);
    CHECK(eng.model.fp8_fast_accumulation == c->fp8_fast_accumulation);
    CHECK(eng.model.fp8_static_attention_output == c->fp8_static_attention_output);
    CHECK(eng.model.fused_decode_append == c->fused_decode_append);
    CHECK(eng.model.mla_kernel == c->mla_kernel);
    CHECK(eng.model.c8_prefill == c->c8_prefill);
    CHECK(eng.model.cuda_graph_max_batch == c->cuda_graph_max_batch);
  }
  CHECK(files >= 2);  // server.json and the CUDA Llama-3-8B example
}

}  // namespace
}  // namespace llm
